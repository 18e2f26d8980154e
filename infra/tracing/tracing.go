// Package tracing records tokenguard's work as OpenTelemetry spans on the API alone (SDK and
// exporter are the application's), and instruments HTTP with otelhttp, showing URLs without their
// query. A span never carries a token, secret, code or account id: errors are recorded by Class only.
package tracing

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/usecase"
)

// Scope is the instrumentation scope of tokenguard's spans.
const Scope = "github.com/tokenguard/tokenguard"

// The attributes of tokenguard's spans.
const (
	Connection    = attribute.Key("tokenguard.connection")
	Provider      = attribute.Key("tokenguard.provider")
	Outcome       = attribute.Key("tokenguard.outcome")
	VersionBefore = attribute.Key("tokenguard.version.before")
	VersionAfter  = attribute.Key("tokenguard.version.after")
	Waited        = attribute.Key("tokenguard.waited_for_other_process")
	Forced        = attribute.Key("tokenguard.forced")
	SweepKind     = attribute.Key("tokenguard.sweep.kind")
	ErrorType     = attribute.Key("error.type") // Class of a failed step's error
)

// Tracer records spans on a TracerProvider. It is safe for concurrent use.
type Tracer struct {
	tracer trace.Tracer
}

// New records on tp; nil is the global provider.
func New(tp trace.TracerProvider) *Tracer {
	tp = cmp.Or(tp, otel.GetTracerProvider())
	return &Tracer{tracer: tp.Tracer(Scope)}
}

// Start implements usecase.Tracer.
func (t *Tracer) Start(ctx context.Context, step usecase.Step, connection string) (context.Context, usecase.Span) {
	ctx, s := t.tracer.Start(ctx, string(step))
	if connection != "" {
		s.SetAttributes(Connection.String(connection))
	}
	return ctx, span{s: s, step: step}
}

// Call opens the span of a call made for connection (the API call, the
// proxied request, the worker's job); end closes it, failed if err != nil.
func (t *Tracer) Call(ctx context.Context, name, connection string, kind trace.SpanKind, attrs ...attribute.KeyValue) (context.Context, func(err error)) {
	ctx, s := t.tracer.Start(ctx, name, trace.WithSpanKind(kind),
		trace.WithAttributes(Connection.String(connection)), trace.WithAttributes(attrs...))
	return ctx, func(err error) {
		fail(s, err)
		s.End()
	}
}

type span struct {
	s    trace.Span
	step usecase.Step
}

func (s span) End(f usecase.Facts, err error) {
	defer s.s.End()
	if !s.s.IsRecording() {
		return
	}
	attrs := make([]attribute.KeyValue, 0, 8)
	add := func(on bool, kv ...attribute.KeyValue) {
		if on {
			attrs = append(attrs, kv...)
		}
	}
	add(f.Provider != "", Provider.String(f.Provider))
	// A read connection that names no stored provider.
	add(f.Provider == "" && (f.OldVersion > 0 || f.NewVersion > 0), Provider.String(domain.ReservedProviderName))
	add(f.Outcome != "", Outcome.String(string(f.Outcome)))
	add(f.OldVersion > 0, VersionBefore.Int64(f.OldVersion))
	add(f.NewVersion > 0, VersionAfter.Int64(f.NewVersion))
	add(s.step == usecase.StepRefresh || s.step == usecase.StepLockWait || s.step == usecase.StepLease, Waited.Bool(f.Waited))
	add(f.Forced, Forced.Bool(true))
	add(s.step == usecase.StepSweep, SweepKind.String(f.SweepKind),
		attribute.Int("tokenguard.sweep.due", f.Sweep.Due),
		attribute.Int("tokenguard.sweep.refreshed", f.Sweep.Refreshed),
		attribute.Int("tokenguard.sweep.skipped", f.Sweep.Skipped),
		attribute.Int("tokenguard.sweep.fresh", f.Sweep.Fresh),
		attribute.Int("tokenguard.sweep.failed", f.Sweep.Failed))
	s.s.SetAttributes(attrs...)
	fail(s.s, err)
}

// fail marks s failed with err's class, never its message.
func fail(s trace.Span, err error) {
	if err == nil || !s.IsRecording() {
		return
	}
	c := Class(err)
	s.SetAttributes(ErrorType.String(c))
	s.SetStatus(codes.Error, c)
}

// classes name the errors a span may end with, most specific first.
var classes = []struct {
	err  error
	name string
}{
	{domain.ErrTokenBudgetSpent, "token_budget_spent"},
	{domain.ErrLockTimeout, "lock_timeout"},
	{domain.ErrNeedsReauth, "needs_reauth"},
	{domain.ErrNotFound, "not_found"},
	{domain.ErrInvalidConnection, "invalid_connection"},
	{domain.ErrGrantRevoked, "grant_revoked"},
	{domain.ErrClientRejected, "client_rejected"},
	{domain.ErrEndpointMisconfigured, "endpoint_misconfigured"},
	{domain.ErrUnknownProvider, "unknown_provider"},
	{domain.ErrProviderUnavailable, "provider_unavailable"},
	{domain.ErrRefreshRateLimited, "refresh_rate_limited"},
	{domain.ErrRefreshInProgress, "refresh_in_progress"},
	{domain.ErrConflict, "conflict"},
	{domain.ErrUndecryptable, "undecryptable"},
	{domain.ErrReadOnlyStore, "read_only_store"},
	{domain.ErrStoreUnavailable, "store_unavailable"},
	{domain.ErrUnauthorized, "unauthorized"},
	{context.DeadlineExceeded, "deadline_exceeded"},
	{context.Canceled, "canceled"},
}

// Class names err by the domain error it wraps: a fixed word, free of the provider's message.
func Class(err error) string {
	for _, c := range classes {
		if errors.Is(err, c.err) {
			return c.name
		}
	}
	return "error"
}

// Transport is base (http.DefaultTransport when nil) with otelhttp's client spans on tp (nil: the
// caller's span's provider, else the global one) and the global propagator. The spans show the
// request's URL without its query, which can carry anything.
func Transport(base http.RoundTripper, tp trace.TracerProvider) http.RoundTripper {
	base = cmp.Or(base, http.DefaultTransport)
	return hideQuery{next: otelhttp.NewTransport(restoreQuery{next: base}, otelhttp.WithTracerProvider(tp))} // nil: no-op
}

// Client is a copy of c (a zero client when nil) on Transport.
func Client(c *http.Client, tp trace.TracerProvider) *http.Client {
	out := *cmp.Or(c, &http.Client{})
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
