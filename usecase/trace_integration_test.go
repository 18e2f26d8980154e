package usecase_test

import (
	"context"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/infra/tracing"
	"github.com/tokenguard/tokenguard/internal/testworld"
	"github.com/tokenguard/tokenguard/usecase"
)

// spanNamed returns the ended spans named name.
func spanNamed(spans []sdktrace.ReadOnlySpan, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func oneSpan(t *testing.T, spans []sdktrace.ReadOnlySpan, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	got := spanNamed(spans, name)
	if len(got) != 1 {
		var names []string
		for _, s := range spans {
			names = append(names, s.Name())
		}
		t.Fatalf("%d spans named %s, want 1; spans: %v", len(got), name, names)
	}
	return got[0]
}

func spanAttr(s sdktrace.ReadOnlySpan, key string) any {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.AsInterface()
		}
	}
	return nil
}

// tracedStack is a process whose use case and token endpoint client
// record spans into sr.
func tracedStack(t *testing.T, w *testworld.World, opts usecase.Options) (*testworld.Stack, *tracetest.SpanRecorder) {
	t.Helper()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	opts.Tracer = tracing.New(tp)
	hc := tracing.Client(provider.NewHTTPClient(5*time.Second), tp)
	return w.StackWith(t, provider.NewRefresher(w.OAuth, hc), opts), sr
}

// A refresh is one trace: the Token call, the pass through the lock with
// the connection, outcome and versions, the lock wait, the re-read, the
// lease, the provider call with its HTTP request, the commit. A cache hit
// records no span; the miss before it (the control) does. No span carries
// a token or the client secret.
func TestTracedRefresh(t *testing.T) {
	w := testworld.New(t, 3*time.Second)
	admin := w.Stack(t, usecase.Options{})
	granted := w.Connect(t, admin)
	opts := usecase.Options{Skew: time.Second, LockWait: 5 * time.Second, RefreshTimeout: 3 * time.Second}
	s, sr := tracedStack(t, w, opts)
	queries := testworld.CountQueries(t, s.DB)
	w.Listen(t, s)
	s.WaitCached(t, queries)

	// The misses until the cache was live (the control) recorded a token
	// lookup each, of a fresh token: no refresh.
	miss := sr.Ended()
	if len(miss) == 0 || len(spanNamed(miss, string(usecase.StepToken))) != len(miss) {
		t.Fatalf("the misses of a fresh token recorded %d spans, want token lookups only", len(miss))
	}
	// Hits: nothing more.
	for range 100 {
		if _, err := s.UC.Token(context.Background(), conn); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(sr.Ended()); n != len(miss) {
		t.Fatalf("100 cache hits recorded %d spans", n-len(miss))
	}

	waitUntilStale(t, admin, opts.Skew)
	tok, err := s.UC.Token(context.Background(), conn)
	if err != nil {
		t.Fatal(err)
	}
	spans := sr.Ended()[len(miss):]
	token := oneSpan(t, spans, string(usecase.StepToken))
	refresh := oneSpan(t, spans, string(usecase.StepRefresh))
	for _, s := range spans {
		if s.SpanContext().TraceID() != token.SpanContext().TraceID() {
			t.Errorf("span %s is in another trace", s.Name())
		}
	}
	if refresh.Parent().SpanID() != token.SpanContext().SpanID() {
		t.Error("the refresh is not under the token lookup")
	}
	for _, step := range []usecase.Step{usecase.StepLockWait, usecase.StepReread, usecase.StepLease, usecase.StepProvider, usecase.StepCommit} {
		if sp := oneSpan(t, spans, string(step)); sp.Parent().SpanID() != refresh.SpanContext().SpanID() {
			t.Errorf("%s is not under the refresh", step)
		}
	}
	call := oneSpan(t, spans, string(usecase.StepProvider))
	var http sdktrace.ReadOnlySpan
	for _, sp := range spans {
		if sp.Parent().SpanID() == call.SpanContext().SpanID() {
			http = sp
		}
	}
	if http == nil || spanAttr(http, "url.full") != w.OAuth.Endpoint.TokenURL {
		t.Fatalf("no HTTP request to the token endpoint under the provider call")
	}
	want := map[string]any{"tokenguard.connection": conn, "tokenguard.provider": "default", "tokenguard.outcome": "ok",
		"tokenguard.version.before": granted.Version, "tokenguard.version.after": tok.Version,
		"tokenguard.waited_for_other_process": false}
	for k, v := range want {
		if got := spanAttr(refresh, k); got != v {
			t.Errorf("refresh %s = %v, want %v", k, got, v)
		}
	}
	if tok.Version != granted.Version+1 {
		t.Errorf("version %d after the refresh, want %d", tok.Version, granted.Version+1)
	}
	stored := admin.MustGet(t)
	checkNoSecret(t, sr.Ended(), granted.AccessToken.Reveal(), granted.RefreshToken.Reveal(),
		stored.AccessToken.Reveal(), stored.RefreshToken.Reveal(), w.OAuth.ClientSecret)
}

// A process that meets another's refresh at the provider waits for it:
// its read sees the lease, and its wait (no lock, no pass of its own)
// says it waited for another process; it stores nothing.
func TestTracedWaitForAnotherProcess(t *testing.T) {
	w := testworld.New(t, 3*time.Second)
	admin := w.Stack(t, usecase.Options{})
	w.Connect(t, admin)
	opts := usecase.Options{Skew: time.Second, LockWait: 5 * time.Second, RefreshTimeout: 3 * time.Second}
	waitUntilStale(t, admin, opts.Skew)
	first := &announcing{next: provider.NewRefresher(w.OAuth, nil), called: make(chan struct{}, 1)}
	a := w.StackWith(t, first, opts)
	w.Provider.SetRefreshLatency(500 * time.Millisecond)
	aDone := make(chan error, 1)
	go func() {
		_, err := a.UC.Token(context.Background(), conn)
		aDone <- err
	}()
	<-first.called
	b, sr := tracedStack(t, w, opts)
	if _, err := b.UC.Token(context.Background(), conn); err != nil {
		t.Fatal(err)
	}
	if err := <-aDone; err != nil {
		t.Fatal(err)
	}
	w.Provider.SetRefreshLatency(0)
	spans := sr.Ended()
	if n := len(spanNamed(spans, string(usecase.StepRefresh))); n != 0 {
		t.Errorf("the waiting process ran %d passes through the lock, want none", n)
	}
	waits := spanNamed(spans, string(usecase.StepLockWait))
	if len(waits) != 1 || spanAttr(waits[0], "tokenguard.waited_for_other_process") != true {
		t.Errorf("%d lock waits; want one that says it waited for another process", len(waits))
	}
	if n := len(spanNamed(spans, string(usecase.StepProvider))); n != 0 {
		t.Errorf("the waiting process called the provider %d times", n)
	}
	if st := w.Provider.Stats(); st.Refreshes != 1 || st.RefreshReuse != 0 {
		t.Errorf("provider: %d refreshes, %d reuse", st.Refreshes, st.RefreshReuse)
	}
}

// checkNoSecret fails if any span's name, attributes, status or events
// carry one of secrets.
func checkNoSecret(t *testing.T, spans []sdktrace.ReadOnlySpan, secrets ...string) {
	t.Helper()
	if len(spans) == 0 {
		t.Fatal("no span to look at")
	}
	for _, s := range spans {
		texts := []string{s.Name(), s.Status().Description}
		for _, kv := range s.Attributes() {
			texts = append(texts, kv.Value.String())
		}
		for _, e := range s.Events() {
			texts = append(texts, e.Name)
			for _, kv := range e.Attributes {
				texts = append(texts, kv.Value.String())
			}
		}
		for _, sec := range secrets {
			if sec == "" {
				t.Fatal("an empty secret to look for")
			}
			for _, x := range texts {
				if strings.Contains(x, sec) {
					t.Errorf("span %s carries a secret", s.Name())
				}
			}
		}
	}
}

// A sweep round is one span with its counts, over a refresh span for each
// connection it looked at: the refreshed ones with their outcome and
// versions, the one another process holds marked as waited for.
func TestTracedSweep(t *testing.T) {
	w := testworld.New(t, time.Hour)
	sr := tracetest.NewSpanRecorder()
	s := w.Stack(t, usecase.Options{Tracer: tracing.New(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr)))})
	other := w.Stack(t, usecase.Options{})
	names := w.ConnectMany(t, s, 5)
	release := holdLeaseOn(t, &testworld.Stack{DB: other.DB, Repo: other.Repo}, names[2])
	rep, err := s.UC.RefreshAhead(context.Background(), s.Repo, 2*time.Hour, 2)
	release()
	if err != nil || rep.Due != 5 || rep.Refreshed != 4 || rep.Skipped != 1 {
		t.Fatalf("sweep: %+v, %v", rep, err)
	}
	spans := sr.Ended()
	sweep := oneSpan(t, spans, string(usecase.StepSweep))
	for k, v := range map[string]any{"tokenguard.sweep.kind": "refresh_ahead", "tokenguard.sweep.due": int64(5),
		"tokenguard.sweep.refreshed": int64(4), "tokenguard.sweep.skipped": int64(1), "tokenguard.sweep.failed": int64(0)} {
		if got := spanAttr(sweep, k); got != v {
			t.Errorf("sweep %s = %v, want %v", k, got, v)
		}
	}
	refreshes := spanNamed(spans, string(usecase.StepRefresh))
	if len(refreshes) != 5 {
		t.Fatalf("%d refresh spans, want one per connection", len(refreshes))
	}
	ok, busy := 0, 0
	for _, r := range refreshes {
		if r.Parent().SpanID() != sweep.SpanContext().SpanID() {
			t.Error("a refresh is not under the sweep")
		}
		switch {
		case spanAttr(r, "tokenguard.outcome") == "ok" && spanAttr(r, "tokenguard.version.after") == int64(2):
			ok++
		case spanAttr(r, "tokenguard.connection") == names[2] && spanAttr(r, "tokenguard.waited_for_other_process") == true:
			busy++
		}
	}
	if ok != 4 || busy != 1 {
		t.Errorf("%d refreshed and %d busy refresh spans, want 4 and 1", ok, busy)
	}
	if n := len(spanNamed(spans, string(usecase.StepProvider))); n != 4 {
		t.Errorf("%d provider calls traced, want 4", n)
	}
}
