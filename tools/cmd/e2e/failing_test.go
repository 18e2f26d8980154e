package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/waitfor"
)

// testUnknownRefusalFailing: the provider answers every refresh with a
// code no table knows while the server (under load), the worker and the
// batch all use the connection. The three processes share the backoff
// through the database: at most 6 refresh requests reach the provider
// before the connection is shown failing (after 3 answers, at about 15 s),
// tokenctl status and GET /connections show the last HTTP status and
// code, the server answers 503 refresh_failing (never 409 needs_reauth)
// once the token expired, one connection.refresh_failing webhook is
// delivered; when the provider answers again the next attempt succeeds
// and connection.recovered is delivered.
func testUnknownRefusalFailing(t *testing.T, bin string) {
	var (
		armed atomic.Bool
		asked atomic.Int64
	)
	hook := startHookTally(t)
	s := newStack(t, bin, stackOpts{lifetime: lifetime, skew: skew,
		fault: func() sandbox.Fault {
			if armed.Load() {
				asked.Add(1)
				return sandbox.FaultUnknownCode
			}
			return sandbox.FaultNone
		},
		extraEnv: []string{"WEBHOOK_URL=" + hook.srv.URL, "WEBHOOK_SECRET=whsec_e2e_0123456789abcdef"}})
	s.migrate()
	const conn = "acme"
	s.importGrant(conn)
	server := s.start("server")
	s.waitHealthy(server)
	worker := s.start("worker")
	batchApp := s.start("batch", "--every", "300ms")
	load := startStatusLoad(s, conn, 4)
	time.Sleep(lifetime)

	armed.Store(true)
	armedAt := time.Now()
	failure := waitOnlyStatus(t, s, "failing", 40*time.Second)
	took, n := time.Since(armedAt), asked.Load()
	t.Logf("failing after %v and %d refresh requests at the provider from three processes: %v", took.Round(time.Millisecond), n, failure)
	if n > 6 {
		t.Errorf("%d refresh requests before the connection was failing, want at most 6", n)
	}
	if failure["http_status"] != float64(400) || failure["code"] != "unrecognized_error" || failure["next_attempt"] == nil {
		t.Errorf("failure %v: want HTTP 400 unrecognized_error and a next attempt", failure)
	}
	if r := run(t, bin, "tokenctl", s.env, "", "status"); r.code != 0 || !strings.Contains(r.stdout, " failing ") ||
		!strings.Contains(r.stdout, "HTTP 400 unrecognized_error") {
		t.Errorf("tokenctl status: exit %d\n%s", r.code, r.stdout)
	}
	time.Sleep(lifetime) // the last token has expired by now
	during := load.reset()
	if during["503 refresh_failing"] == 0 || during["409 needs_reauth"] > 0 {
		t.Errorf("server answers while failing: %v; want 503 refresh_failing, never 409", during)
	}
	// Every surface names the provider's answer.
	if code, header := errorHeader(t, s, "/connections/"+conn+"/resource"); code != http.StatusServiceUnavailable || header != "refresh_failing" {
		t.Errorf("resource while failing: %d Tokenguard-Error %q, want 503 refresh_failing", code, header)
	}
	if _, body := s.do(http.MethodGet, "/connections/"+conn+"/resource", ""); !strings.Contains(body, "HTTP 400 unrecognized_error") {
		t.Errorf("resource while failing: %s, want the provider's answer named", body)
	}
	page := consoleBody(t, consoleLogin(t, s, s.key), s, http.MethodGet, "/console/connections/"+conn, nil, http.StatusOK)
	if !strings.Contains(page, ">failing<") || !strings.Contains(page, "HTTP 400 unrecognized_error") || strings.Contains(page, "client_rejected") {
		t.Errorf("the console's connection page does not say failing with the provider's answer")
	}

	armed.Store(false)
	waitOnlyStatus(t, s, "active", 70*time.Second)
	if n := asked.Load(); n > 6 {
		t.Errorf("%d refresh requests refused in all, want at most 6", n)
	}
	waitfor.Until(t, 20*time.Second, "no connection.recovered webhook", func() bool { return hook.delivered("connection.recovered") > 0 })
	if f, r := hook.delivered("connection.refresh_failing"), hook.delivered("connection.recovered"); f != 1 || r != 1 {
		t.Errorf("webhooks delivered: %d connection.refresh_failing, %d connection.recovered; want 1 and 1", f, r)
	}
	hookBody := hook.failingBody()
	var hookEvent struct {
		Data struct {
			HTTPStatus int    `json:"http_status"`
			Code       string `json:"code"`
		} `json:"data"`
	}
	if json.Unmarshal([]byte(hookBody), &hookEvent) != nil || hookEvent.Data.HTTPStatus != 400 || hookEvent.Data.Code != "unrecognized_error" {
		t.Errorf("connection.refresh_failing webhook %s: want http_status 400, code unrecognized_error", hookBody)
	}
	after := load.finish()
	if after["200"] == 0 {
		t.Errorf("no call succeeded after the recovery: %v", after)
	}
	for _, a := range []*app{batchApp, worker, server} {
		s.stop(a)
	}
}

// hookTally counts the webhook deliveries by type and keeps the
// connection.refresh_failing one's body.
type hookTally struct {
	srv         *httptest.Server
	mu          sync.Mutex
	kinds       map[string]int
	failingHook string
}

func startHookTally(t *testing.T) *hookTally {
	h := &hookTally{kinds: map[string]int{}}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var e struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(body, &e)
		h.mu.Lock()
		h.kinds[e.Type]++
		if e.Type == "connection.refresh_failing" {
			h.failingHook = string(body)
		}
		h.mu.Unlock()
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *hookTally) delivered(kind string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.kinds[kind]
}

func (h *hookTally) failingBody() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.failingHook
}

// waitOnlyStatus waits for the stack's only connection, as GET
// /connections shows it, to have status want; it returns its failure.
func waitOnlyStatus(t *testing.T, s *stack, want string, within time.Duration) map[string]any {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		code, body := s.do(http.MethodGet, "/connections", "")
		var page struct {
			Connections []struct {
				Status  string         `json:"status"`
				Failure map[string]any `json:"failure"`
			} `json:"connections"`
		}
		if code != http.StatusOK || json.Unmarshal([]byte(body), &page) != nil || len(page.Connections) != 1 {
			t.Fatalf("GET /connections: %d %s", code, body)
		}
		if st := page.Connections[0].Status; st == want {
			return page.Connections[0].Failure
		} else if time.Now().After(deadline) {
			t.Fatalf("connection %s after %v, want %s", st, within, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
