package tracing

import (
	"cmp"
	"context"
	"net/http"
	"slices"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/trace"
)

// Transport is base (http.DefaultTransport when nil) with otelhttp's client spans on tp (nil: the
// caller's span's provider, else the global one) and the global propagator. The spans show the
// request's URL without its query, which can carry anything.
func Transport(base http.RoundTripper, tp trace.TracerProvider) http.RoundTripper {
	base = cmp.Or(base, http.DefaultTransport)
	return hideQuery{next: otelhttp.NewTransport(restoreQuery{next: base}, otelhttp.WithTracerProvider(tp))} // nil: no-op
}

// Client is a copy of c (a zero client when nil) on Transport.
func Client(c *http.Client, tp trace.TracerProvider) *http.Client {
	var out http.Client
	if c != nil {
		out = *c
	}
	out.Transport = Transport(out.Transport, tp)
	return &out
}

// Handler is h with otelhttp's server spans on tp (nil: the global provider), continuing the
// caller's trace and named by the route's pattern. otelhttp records the path, never the query. The
// untraced paths record nothing.
func Handler(h http.Handler, tp trace.TracerProvider, untraced ...string) http.Handler {
	return otelhttp.NewHandler(h, "http.server", otelhttp.WithSpanNameFormatter(spanName), otelhttp.WithTracerProvider(tp),
		otelhttp.WithFilter(func(r *http.Request) bool { return !slices.Contains(untraced, r.URL.Path) }))
}

// spanName is "{method} {route}" per OpenTelemetry's HTTP conventions; the
// method alone before routing or without a route.
func spanName(_ string, r *http.Request) string {
	switch {
	case r.Pattern == "":
		return r.Method
	case strings.Contains(r.Pattern, " "): // "GET /path": the pattern has its method
		return r.Pattern
	}
	return r.Method + " " + r.Pattern
}

// queryKey carries a request's query past otelhttp's transport.
type queryKey struct{}

// hideQuery hands the request on without its query, for restoreQuery.
type hideQuery struct{ next http.RoundTripper }

func (h hideQuery) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL == nil || r.URL.RawQuery == "" {
		return h.next.RoundTrip(r)
	}
	shown := r.Clone(context.WithValue(r.Context(), queryKey{}, r.URL.RawQuery))
	shown.URL.RawQuery = ""
	return h.next.RoundTrip(shown)
}

// restoreQuery puts back the query hideQuery took off.
type restoreQuery struct{ next http.RoundTripper }

func (t restoreQuery) RoundTrip(r *http.Request) (*http.Response, error) {
	if q, ok := r.Context().Value(queryKey{}).(string); ok && r.URL.RawQuery == "" {
		r = r.Clone(r.Context())
		r.URL.RawQuery = q
	}
	return t.next.RoundTrip(r)
}
