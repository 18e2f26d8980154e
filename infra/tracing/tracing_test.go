package tracing_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/tracing"
	"github.com/tokenguard/tokenguard/usecase"
)

func recorder() (*tracetest.SpanRecorder, *sdktrace.TracerProvider) {
	sr := tracetest.NewSpanRecorder()
	return sr, sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// The client spans show the URL without its query, while the server gets
// the query and the span's trace context (W3C traceparent). The control
// is otelhttp's own transport, whose span shows the query.
func TestTransportHidesTheQuery(t *testing.T) {
	var gotQuery, gotParent string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotQuery, gotParent = r.URL.RawQuery, r.Header.Get("Traceparent")
		_, _ = io.WriteString(w, "ok")
	}))
	defer srv.Close()
	withPropagator(t, propagation.TraceContext{})
	// shown is the client span's url.full after a call through rt.
	shown := func(rt func(trace.TracerProvider) http.RoundTripper) string {
		t.Helper()
		sr, tp := recorder()
		ctx, parent := tp.Tracer("test").Start(context.Background(), "parent")
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/oauth2/token?tenant=t-secret-query", strings.NewReader("grant_type=refresh_token"))
		resp, err := (&http.Client{Transport: rt(tp)}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		parent.End()
		if gotQuery != "tenant=t-secret-query" {
			t.Errorf("the server got query %q", gotQuery)
		}
		if want := parent.SpanContext().TraceID().String(); !strings.Contains(gotParent, want) {
			t.Errorf("traceparent %q, want trace %s", gotParent, want)
		}
		spans := sr.Ended()
		if len(spans) != 2 || spans[0].SpanKind() != trace.SpanKindClient {
			t.Fatalf("%d spans, want the client's, then the parent", len(spans))
		}
		return attrs(spans[0])["url.full"].AsString()
	}
	if got := shown(func(tp trace.TracerProvider) http.RoundTripper { return tracing.Transport(nil, tp) }); got != srv.URL+"/oauth2/token" {
		t.Errorf("url.full = %q, want the URL without its query", got)
	}
	control := shown(func(tp trace.TracerProvider) http.RoundTripper {
		return otelhttp.NewTransport(http.DefaultTransport, otelhttp.WithTracerProvider(tp))
	})
	if !strings.Contains(control, "t-secret-query") {
		t.Errorf("control: otelhttp's own url.full = %q: the check sees nothing", control)
	}
}

func withPropagator(t *testing.T, p propagation.TextMapPropagator) {
	t.Helper()
	prev := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(p)
	t.Cleanup(func() { otel.SetTextMapPropagator(prev) })
}

// The server span continues the caller's trace, is named by the route
// and records neither the query nor the caller's headers.
func TestHandlerContinuesTheCallersTrace(t *testing.T) {
	sr, tp := recorder()
	withPropagator(t, propagation.TraceContext{})
	mux := http.NewServeMux()
	var inner trace.SpanContext
	mux.HandleFunc("GET /connections/{name}/token", func(w http.ResponseWriter, r *http.Request) {
		inner = trace.SpanContextFromContext(r.Context())
	})
	mux.HandleFunc("GET /healthz", func(http.ResponseWriter, *http.Request) {})
	srv := httptest.NewServer(tracing.Handler(mux, tp, "/healthz"))
	defer srv.Close()
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	for _, path := range []string{"/connections/acme/token?session=tgs_secret", "/healthz"} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		req.Header.Set("Traceparent", "00-"+traceID+"-"+parentID+"-01")
		req.Header.Set("Authorization", "Bearer tgk_secret")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	spans := sr.Ended()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want one (none for /healthz)", len(spans))
	}
	s := spans[0]
	if s.Name() != "GET /connections/{name}/token" || s.SpanKind() != trace.SpanKindServer {
		t.Errorf("span %q kind %v", s.Name(), s.SpanKind())
	}
	if s.SpanContext().TraceID().String() != traceID || s.Parent().SpanID().String() != parentID || !s.Parent().IsRemote() {
		t.Errorf("span %v under %v, want the caller's trace %s under %s", s.SpanContext(), s.Parent(), traceID, parentID)
	}
	if inner.SpanID() != s.SpanContext().SpanID() {
		t.Error("the handler does not run under the server span")
	}
	for _, kv := range s.Attributes() {
		if v := kv.Value.String(); strings.Contains(v, "secret") {
			t.Errorf("attribute %s = %q", kv.Key, v)
		}
	}
}

// A step's span carries the connection, the facts the step learned and,
// when it failed, the error's class, never its message.
func TestSpanFactsAndErrors(t *testing.T) {
	sr, tp := recorder()
	tr := tracing.New(tp)
	ctx, sp := tr.Start(context.Background(), usecase.StepRefresh, "acme")
	_, child := tr.Start(ctx, usecase.StepProvider, "acme")
	pe := &domain.ProviderError{Code: "temporarily_unavailable", HTTPStatus: 503, Err: errors.New("body said ory_rt_secret")}
	child.End(usecase.Facts{Provider: "hubspot", OldVersion: 3, Outcome: usecase.OutcomeTransientError}, fmt.Errorf("refresh acme: %w", pe))
	sp.End(usecase.Facts{Provider: "hubspot", OldVersion: 3, NewVersion: 4, Outcome: usecase.OutcomeOK, Waited: true}, nil)

	spans := sr.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans", len(spans))
	}
	provider, refresh := spans[0], spans[1]
	if provider.Parent().SpanID() != refresh.SpanContext().SpanID() {
		t.Error("the provider call's span is not under the refresh's")
	}
	a := attrs(refresh)
	want := map[attribute.Key]any{tracing.Connection: "acme", tracing.Provider: "hubspot", tracing.Outcome: "ok",
		tracing.VersionBefore: int64(3), tracing.VersionAfter: int64(4), tracing.Waited: true}
	for k, v := range want {
		if got := a[k].AsInterface(); got != v {
			t.Errorf("refresh %s = %v, want %v", k, got, v)
		}
	}
	if refresh.Status().Code != codes.Unset {
		t.Errorf("refresh status %v", refresh.Status())
	}
	if st := provider.Status(); st.Code != codes.Error || st.Description != "provider_unavailable" {
		t.Errorf("provider status %+v, want Error provider_unavailable", st)
	}
	if got := attrs(provider)[tracing.ErrorType].AsString(); got != "provider_unavailable" {
		t.Errorf("error.type = %q", got)
	}
	// The process's own provider is named as the metrics name it.
	_, own := tr.Start(context.Background(), usecase.StepRefresh, "acme")
	own.End(usecase.Facts{OldVersion: 1, NewVersion: 2, Outcome: usecase.OutcomeOK}, nil)
	if got := attrs(sr.Ended()[2])[tracing.Provider].AsString(); got != "default" {
		t.Errorf("provider of a connection that names none = %q, want default", got)
	}
	for _, s := range spans {
		for _, kv := range s.Attributes() {
			if strings.Contains(kv.Value.String(), "secret") {
				t.Errorf("%s: %s = %q", s.Name(), kv.Key, kv.Value.String())
			}
		}
		if len(s.Events()) != 0 {
			t.Errorf("%s has events %v: an error's message would be one", s.Name(), s.Events())
		}
	}
}

func TestClass(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("x: %w: %w", domain.ErrLockTimeout, domain.ErrRefreshInProgress), "lock_timeout"},
		{fmt.Errorf("%w: %w", domain.ErrNeedsReauth, domain.ErrGrantRevoked), "needs_reauth"},
		{&domain.ProviderError{Class: domain.GrantDead}, "grant_revoked"},
		{&domain.ProviderError{Class: domain.ClientRejected}, "client_rejected"},
		{fmt.Errorf("read: %w", context.DeadlineExceeded), "deadline_exceeded"},
		{errors.New("ory_at_secret"), "error"},
	} {
		if got := tracing.Class(tc.err); got != tc.want {
			t.Errorf("Class(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

// Without a recording provider a step costs no attribute and records
// nothing.
func TestNoopProvider(t *testing.T) {
	tr := tracing.New(noop.NewTracerProvider())
	ctx, sp := tr.Start(context.Background(), usecase.StepToken, "acme")
	sp.End(usecase.Facts{Outcome: usecase.OutcomeOK}, errors.New("x"))
	if trace.SpanFromContext(ctx).IsRecording() {
		t.Error("a noop provider's span records")
	}
}
