package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
)

// oneKey accepts exactly one API key.
type oneKey struct{ key string }

func (k oneKey) Verify(_ context.Context, s domain.Secret) (int32, string, error) {
	if s.Reveal() == k.key {
		return 1, "test", nil
	}
	return 0, "", domain.ErrUnauthorized
}

// noSessions knows no connect session.
type noSessions struct{}

func (noSessions) Create(context.Context, domain.ConnectSession) (domain.Secret, time.Time, error) {
	return domain.NewSecret("tgs_x"), time.Now(), nil
}
func (noSessions) Open(context.Context, domain.Secret, domain.Secret, string, string) (domain.ConnectSession, error) {
	return domain.ConnectSession{}, domain.ErrUnauthorized
}
func (noSessions) Peek(context.Context, domain.Secret) (domain.ConnectSession, error) {
	return domain.ConnectSession{}, domain.ErrUnauthorized
}
func (noSessions) Finish(context.Context, domain.Secret, string) (domain.ConnectSession, error) {
	return domain.ConnectSession{}, domain.ErrUnauthorized
}

type okPinger struct{}

func (okPinger) PingContext(context.Context) error { return nil }

func testServer(e Edges) *Server {
	return New(Deps{
		Keys:     oneKey{"tgk_good"},
		Sessions: noSessions{},
		Flows:    noFlows{},
		DB:       okPinger{},
		OAuth: &oauth2.Config{ClientID: "c", RedirectURL: "http://127.0.0.1:8080/oauth/callback",
			Endpoint: oauth2.Endpoint{AuthURL: "http://p/auth", TokenURL: "http://p/token"}},
		Metrics: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("metrics")) }),
		Edges:   e,
	})
}

var local = Edges{Hosts: []string{"127.0.0.1:8080"}}

// sample fills a route pattern's wildcards.
func sample(path string) string {
	return strings.NewReplacer("{name}", "acme", "{path...}", "v1/x").Replace(path)
}

// TestEveryRouteNeedsAnAPIKey walks the route table: a route that is not
// one of the five public ones answers 401 with the JSON error shape
// without a key and with a wrong one. A route added to the table without
// thought is covered here.
func TestEveryRouteNeedsAnAPIKey(t *testing.T) {
	s := testServer(local)
	h := s.Handler()
	seen := map[string]bool{}
	for _, rt := range s.routes() {
		id := rt.pattern()
		seen[id] = true
		if _, public := publicRoutes[id]; public {
			continue
		}
		if rt.access != apiKey {
			t.Errorf("%s: access %d, but only the routes of publicRoutes may go without an API key", id, rt.access)
		}
		for _, auth := range []string{"", "Bearer tgk_wrong", "Basic dGVzdDp0ZXN0", "Bearer "} {
			req := httptest.NewRequest(rt.method, "http://127.0.0.1:8080"+sample(rt.path), strings.NewReader("{}"))
			if auth != "" {
				req.Header.Set("Authorization", auth)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			var e errorBody
			if w.Code != http.StatusUnauthorized || json.Unmarshal(w.Body.Bytes(), &e) != nil || e.Code != "unauthorized" || e.Error == "" {
				t.Errorf("%s with %q: %d %s, want 401 with the JSON error shape", id, auth, w.Code, w.Body)
			}
		}
	}
	if len(publicRoutes) != 5 {
		t.Errorf("public routes: %v, want /healthz, /openapi.json, GET and POST /oauth/connect, /oauth/callback only", publicRoutes)
	}
	for id := range publicRoutes {
		if !seen[id] {
			t.Errorf("public route %s is not in the table", id)
		}
	}
	if !seen["GET /metrics"] {
		t.Error("/metrics is not in the table (it must be served behind a key)")
	}
}

// A route whose table entry claims to be public without being listed in
// publicRoutes gets the key check anyway.
func TestUnlistedPublicRouteStillNeedsAKey(t *testing.T) {
	s := testServer(local)
	h := s.guard(route{"GET", "/new", open, 0, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(200) }})
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "http://127.0.0.1:8080/new", nil))
	if w.Code != http.StatusUnauthorized {
		t.Errorf("unlisted open route: %d, want 401", w.Code)
	}
}

func TestPublicRoutesAndKeyAccepted(t *testing.T) {
	h := testServer(local).Handler()
	do := func(method, target, auth string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, target, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	if w := do("GET", "http://127.0.0.1:8080/healthz", ""); w.Code != 200 {
		t.Errorf("healthz: %d", w.Code)
	}
	if w := do("GET", "http://127.0.0.1:8080/metrics", "Bearer tgk_good"); w.Code != 200 || w.Body.String() != "metrics" {
		t.Errorf("metrics with a key: %d %s", w.Code, w.Body)
	}
	for _, q := range []string{"", "?session=", "?session=tgs_unknown", "?connection=acme"} {
		if w := do("GET", "http://127.0.0.1:8080/oauth/connect"+q, ""); w.Code != http.StatusUnauthorized {
			t.Errorf("connect%s: %d, want 401", q, w.Code)
		}
	}
	if w := do("GET", "http://127.0.0.1:8080/oauth/callback?code=x&state=y", ""); w.Code != http.StatusBadRequest {
		t.Errorf("callback without a flow: %d, want 400", w.Code)
	}
}

func TestBrowserPagesAreHTML(t *testing.T) {
	h := testServer(local).Handler()
	req := httptest.NewRequest("GET", "http://127.0.0.1:8080/oauth/connect?session=tgs_unknown", nil)
	req.Header.Set("Accept", "text/html,application/xhtml+xml")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != 401 || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/html") || !strings.Contains(w.Body.String(), "<html") {
		t.Errorf("browser page: %d %s %s", w.Code, w.Header().Get("Content-Type"), w.Body)
	}
}

func TestHostCheck(t *testing.T) {
	pub, _ := url.Parse("https://tg.example.com")
	for _, c := range []struct {
		edges Edges
		host  string
		ok    bool
	}{
		{local, "127.0.0.1:8080", true},
		{local, "localhost:8080", true},
		{local, "[::1]:8080", true},
		{local, "evil.example:8080", false}, // DNS rebinding: a foreign name resolving to us
		{local, "127.0.0.1:9999", false},
		{Edges{PublicURL: pub, Hosts: []string{"0.0.0.0:8080"}}, "tg.example.com", true},
		{Edges{PublicURL: pub, Hosts: []string{"0.0.0.0:8080"}}, "TG.example.com:443", true},
		{Edges{PublicURL: pub, Hosts: []string{"0.0.0.0:8080"}}, "localhost:8080", true},
		{Edges{PublicURL: pub, Hosts: []string{"0.0.0.0:8080"}}, "10.0.0.7:8080", false},
		{Edges{PublicURL: pub, Hosts: []string{":8080"}}, "attacker.example", false},
	} {
		h := testServer(c.edges).Handler()
		req := httptest.NewRequest("GET", "/metrics", nil)
		req.Host = c.host
		req.Header.Set("Authorization", "Bearer tgk_good")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if got := w.Code != http.StatusMisdirectedRequest; got != c.ok {
			t.Errorf("edges %+v, Host %q: %d, want accepted %t", c.edges.Hosts, c.host, w.Code, c.ok)
		}
		if w.Header().Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("Host %q: no nosniff", c.host)
		}
	}
}

func TestRateLimitPerKey(t *testing.T) {
	h := testServer(Edges{Hosts: local.Hosts, Rate: 1, Burst: 3}).Handler()
	codes := map[int]int{}
	var retry string
	for range 5 {
		req := httptest.NewRequest("GET", "http://127.0.0.1:8080/metrics", nil)
		req.Header.Set("Authorization", "Bearer tgk_good")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		codes[w.Code]++
		if w.Code == http.StatusTooManyRequests {
			retry = w.Header().Get("Retry-After")
		}
	}
	if codes[200] != 3 || codes[429] != 2 || retry != "1" {
		t.Errorf("5 calls at burst 3, 1/s: %v, Retry-After %q", codes, retry)
	}
}

func TestBodyLimit(t *testing.T) {
	var got error
	s := testServer(local)
	h := s.guard(route{"POST", "/connect-sessions", apiKey, 10, func(w http.ResponseWriter, r *http.Request) {
		_, got = json.NewDecoder(r.Body).Token()
		buf := make([]byte, 100)
		_, got = r.Body.Read(buf)
	}})
	req := httptest.NewRequest("POST", "http://127.0.0.1:8080/connect-sessions", strings.NewReader(strings.Repeat(" ", 50)+"{}"))
	req.Header.Set("Authorization", "Bearer tgk_good")
	h.ServeHTTP(httptest.NewRecorder(), req)
	if got == nil || !strings.Contains(got.Error(), "too large") {
		t.Errorf("a body over the limit read as %v", got)
	}
}

func TestReturnAllowed(t *testing.T) {
	allowed := []string{"https://app.example.com/settings/", "http://localhost:3000"}
	for target, want := range map[string]bool{
		"https://app.example.com/settings/":             true,
		"https://app.example.com/settings/integrations": true,
		"https://app.example.com/settings?x=1":          true,
		"https://app.example.com/settingsevil":          false,
		"https://app.example.com/other":                 false,
		"https://app.example.com.evil.com/settings/":    false,
		"http://app.example.com/settings/":              false,
		"https://user@app.example.com/settings/":        false,
		"http://localhost:3000/anything":                true,
		"http://localhost:3001/":                        false,
		"javascript:alert(1)":                           false,
		"//app.example.com/settings/":                   false,
	} {
		if got := returnAllowed(target, allowed); got != want {
			t.Errorf("returnAllowed(%q) = %t, want %t", target, got, want)
		}
	}
}
