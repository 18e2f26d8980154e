package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/tools/internal/demo"
)

// exportedSpan is a span as the console exporter (stdouttrace) prints it.
type exportedSpan struct {
	Name        string
	SpanContext struct{ TraceID, SpanID string }
	Parent      struct{ TraceID, SpanID string }
	SpanKind    int
	Attributes  []struct {
		Key   string
		Value struct{ Value any }
	}
	Status struct{ Code, Description string }
}

func (s exportedSpan) attr(key string) any {
	for _, a := range s.Attributes {
		if a.Key == key {
			return a.Value.Value
		}
	}
	return nil
}

// spansOf parses the spans an app printed on stdout, one JSON object a
// line.
func spansOf(t *testing.T, a *app) ([]exportedSpan, string) {
	t.Helper()
	<-a.outEOF
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []exportedSpan
	for _, l := range a.lines {
		var s exportedSpan
		if err := json.Unmarshal([]byte(l), &s); err != nil || s.Name == "" {
			t.Errorf("%s printed a line that is not a span: %q", a.Name, tail(l, 300))
			continue
		}
		out = append(out, s)
	}
	return out, strings.Join(a.lines, "\n")
}

// inTrace is the spans of trace id, by name.
func inTrace(spans []exportedSpan, id string) map[string][]exportedSpan {
	out := map[string][]exportedSpan{}
	for _, s := range spans {
		if s.SpanContext.TraceID == id {
			out[s.Name] = append(out[s.Name], s)
		}
	}
	return out
}

const (
	callTrace, callParent   = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	eventTrace, eventParent = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	// A route for every method (the proxy) is named with the request's
	// method, as OpenTelemetry's HTTP conventions name a server span.
	proxyTrace = "5cf92f3577b34da6a3ce929d0e0e4737"
)

// testTraces runs the server and the worker with OTEL_TRACES_EXPORTER=console.
// A call through the server that refreshes the token, made with the
// test's W3C trace context, is one trace in the server's output: the
// request, the token lookup, the pass through the lock with its
// attributes, the lock wait, the re-read, the lease, the provider call
// with its HTTP request (the token URL without its query), the commit and
// the upstream call. An event queued with another trace context is
// worked by the worker in that trace. No span carries a token the
// sandbox issued, an authorization code, the client secret or the API
// key.
func testTraces(t *testing.T, bin string) {
	var issued secrets
	p, err := sandbox.New(sandbox.Options{AccessTokenLifespan: lifetime, RedirectURIs: []string{"*"}})
	if err != nil {
		t.Fatal(err)
	}
	// The trace context the API receives with each call.
	var (
		mu      sync.Mutex
		apiSeen []string
	)
	srv := httptest.NewServer(issued.tee(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/resource" {
			mu.Lock()
			apiSeen = append(apiSeen, r.Header.Get("Traceparent"))
			mu.Unlock()
		}
		p.Handler().ServeHTTP(w, r)
	})))
	t.Cleanup(srv.Close)
	s := newStack(t, bin, stackOpts{lifetime: lifetime, skew: skew, extraEnv: []string{"OTEL_TRACES_EXPORTER=console", "OTEL_SERVICE_NAME=e2e-apps"}})
	// The apps talk to the tee'd sandbox; the token URL has a query, which
	// no span may show.
	const query = "e2e_query_marker=q5e2a9"
	for i, e := range s.env {
		e = strings.ReplaceAll(e, s.sb.URL, srv.URL)
		if strings.HasPrefix(e, "OAUTH_TOKEN_URL=") {
			e += "?" + query
		}
		s.env[i] = e
	}
	s.sb = &demo.Sandbox{Provider: p, URL: srv.URL}
	s.migrate()
	const conn = "acme"
	granted := s.importGrant(conn)
	server := s.start("server")
	s.waitHealthy(server)
	worker := s.start("worker")
	waitChecked(t, server, worker)
	time.Sleep(time.Until(granted.Add(lifetime))) // the token has expired: the next call refreshes it
	before := p.Stats().Refreshes

	// send calls the server in the caller's trace and returns the status
	// and the answer's event_id, if any.
	send := func(method, path, trace, parent string) (int, int64) {
		req, _ := http.NewRequest(method, "http://"+s.addr+path, strings.NewReader(`{"n":1}`))
		req.Header.Set("Authorization", "Bearer "+s.key)
		req.Header.Set("Traceparent", "00-"+trace+"-"+parent+"-01")
		resp, err := s.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct {
			EventID int64 `json:"event_id"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out.EventID
	}
	if code, _ := send(http.MethodGet, "/connections/"+conn+"/resource", callTrace, callParent); code != http.StatusOK {
		t.Fatalf("GET resource: %d", code)
	}
	if n := p.Stats().Refreshes - before; n != 1 {
		t.Fatalf("the call made %d refreshes, want 1", n)
	}
	if code, _ := send(http.MethodGet, "/connections/"+conn+"/proxy/resource", proxyTrace, callParent); code != http.StatusOK {
		t.Fatalf("GET through the proxy: %d", code)
	}
	code, eventID := send(http.MethodPost, "/connections/"+conn+"/events", eventTrace, eventParent)
	if code != http.StatusAccepted || eventID == 0 {
		t.Fatalf("POST events: %d, event %d", code, eventID)
	}
	if js := waitEvents(t, s.dbURL, []int64{eventID}, 20*time.Second); js[eventID].State != "completed" {
		t.Fatalf("event %d: %+v", eventID, js[eventID])
	}
	s.stop(worker)
	s.stop(server) // the last spans are exported at shutdown
	serverSpans, serverOut := spansOf(t, server)
	workerSpans, workerOut := spansOf(t, worker)

	tokenURL, _, _ := strings.Cut(p.TokenURL(srv.URL), "?")
	call := checkCallTrace(t, serverSpans, conn, tokenURL, srv.URL+"/resource")
	checkEventTrace(t, serverSpans, workerSpans, conn)
	// The API received both traces' context, each from the span of its
	// HTTP request.
	mu.Lock()
	seen := slices.Clone(apiSeen)
	mu.Unlock()
	for _, trace := range []string{callTrace, eventTrace} {
		if !slices.ContainsFunc(seen, func(tp string) bool { return strings.HasPrefix(tp, "00-"+trace+"-") }) {
			t.Errorf("no API call carried trace %s: traceparents %q", trace, seen)
		}
	}

	tokens, codes := issued.list()
	credentials := []string{s.key, strings.TrimPrefix(s.key, "tgk_"), p.ClientSecret(), query}
	checkNoSecretInSpans(t, tokens, codes, credentials, map[string]string{"server": serverOut, "worker": workerOut})
	t.Logf("server: %d spans, the call's trace %v; worker: %d spans, the event's trace %v; scanned for %d tokens, %d codes, %d credentials",
		len(serverSpans), names(call), len(workerSpans), names(inTrace(workerSpans, eventTrace)), len(tokens), len(codes), len(credentials))
}

// checkCallTrace: the call that refreshed is one trace under the test's
// span, with the token lookup, the pass through the lock and its parts,
// the provider call with its HTTP request under it, and the upstream call;
// the proxied call is named with its method. It returns the call's trace.
func checkCallTrace(t *testing.T, serverSpans []exportedSpan, conn, tokenURL, apiURL string) map[string][]exportedSpan {
	call := inTrace(serverSpans, callTrace)
	one := func(name string) exportedSpan {
		t.Helper()
		if len(call[name]) != 1 {
			t.Fatalf("%d %q spans in the call's trace, want 1; the trace: %v", len(call[name]), name, names(call))
		}
		return call[name][0]
	}
	request := one("GET /connections/{name}/resource")
	if proxied := inTrace(serverSpans, proxyTrace); len(proxied["GET /connections/{name}/proxy/{path...}"]) != 1 {
		t.Errorf("the proxied call's spans: %v; want one named GET /connections/{name}/proxy/{path...}", names(proxied))
	}
	if request.Parent.SpanID != callParent {
		t.Errorf("the request's span is under %s, want the caller's %s", request.Parent.SpanID, callParent)
	}
	refresh := one("tokenguard.refresh")
	for k, v := range map[string]any{"tokenguard.connection": conn, "tokenguard.provider": "default", "tokenguard.outcome": "ok",
		"tokenguard.version.before": 1.0, "tokenguard.version.after": 2.0, "tokenguard.waited_for_other_process": false} {
		if got := refresh.attr(k); got != v {
			t.Errorf("refresh %s = %v (%T), want %v", k, got, got, v)
		}
	}
	for _, name := range []string{"tokenguard.proxy", "tokenguard.token", "tokenguard.lock_wait", "tokenguard.reread",
		"tokenguard.lease", "tokenguard.provider_call", "tokenguard.commit"} {
		one(name)
	}
	if got := one("tokenguard.lock_wait").attr("tokenguard.waited_for_other_process"); got != false {
		t.Errorf("lock wait: waited_for_other_process = %v", got)
	}
	var tokenRequest, upstream int
	for _, sps := range call {
		for _, sp := range sps {
			switch sp.attr("url.full") {
			case tokenURL:
				tokenRequest++
				if sp.Parent.SpanID != one("tokenguard.provider_call").SpanContext.SpanID {
					t.Error("the token endpoint's request is not under the provider call")
				}
			case apiURL:
				upstream++
			}
		}
	}
	if tokenRequest != 1 || upstream != 1 {
		t.Errorf("HTTP spans in the call's trace: %d to the token URL %s, %d to the API; the trace: %v", tokenRequest, tokenURL, upstream, names(call))
	}
	return call
}

// checkEventTrace: the worker's job is in the trace of the request that
// queued the event, and makes its API call there.
func checkEventTrace(t *testing.T, serverSpans, workerSpans []exportedSpan, conn string) {
	queued := inTrace(serverSpans, eventTrace)["POST /connections/{name}/events"]
	jobs := inTrace(workerSpans, eventTrace)["tokenguard.job"]
	if len(queued) != 1 || len(jobs) != 1 || jobs[0].Parent.SpanID != queued[0].SpanContext.SpanID {
		t.Fatalf("the event's trace: %d request spans at the server, %d job spans at the worker (under the request: %t); the worker's spans: %v",
			len(queued), len(jobs), len(jobs) == 1 && len(queued) == 1 && jobs[0].Parent.SpanID == queued[0].SpanContext.SpanID, names(inTrace(workerSpans, eventTrace)))
	}
	if got := jobs[0].attr("tokenguard.connection"); got != conn {
		t.Errorf("job connection = %v", got)
	}
	if n := len(inTrace(workerSpans, eventTrace)["tokenguard.api_call"]); n != 1 {
		t.Errorf("%d API calls in the job's trace, want 1", n)
	}

}

// checkNoSecretInSpans: no span in outputs carries a token, a code or a
// credential (after a self-test of the scanner).
func checkNoSecretInSpans(t *testing.T, tokens, codes, credentials []string, outputs map[string]string) {
	if len(tokens) < 4 || len(codes) == 0 {
		t.Fatalf("the tee saw %d tokens and %d codes, want the grant's and the refresh's", len(tokens), len(codes))
	}
	if hits := scan(`{"Key":"x","Value":{"Value":"`+tokens[len(tokens)-1]+`"}}`, tokens); len(hits) != 1 {
		t.Fatal("scanner self-test: it does not see a token in a span")
	}
	for name, text := range outputs {
		if hits := scan(text, append(tokens, codes...)); len(hits) > 0 {
			t.Errorf("%s: %d span(s) carry a token or code, e.g. %q", name, len(hits), tail(hits[0], 300))
		}
		for _, c := range credentials {
			if strings.Contains(text, c) {
				t.Errorf("%s: a span carries the API key, the client secret or the token URL's query", name)
			}
		}
	}
}

func names(trace map[string][]exportedSpan) []string {
	var out []string
	for n, s := range trace {
		out = append(out, fmt.Sprintf("%s×%d", n, len(s)))
	}
	slices.Sort(out)
	return out
}
