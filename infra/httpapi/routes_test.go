package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/httpapi/console"
)

// oneKey accepts exactly one API key with every right, and the keys of
// scoped with theirs.
type oneKey struct {
	key    string
	scoped map[string]domain.KeyAccess
}

func (k oneKey) Verify(_ context.Context, s domain.Secret) (domain.KeyAccess, error) {
	if s.Reveal() == k.key {
		return domain.KeyAccess{ID: 1, Name: "test"}, nil
	}
	if a, ok := k.scoped[s.Reveal()]; ok {
		return a, nil
	}
	return domain.KeyAccess{}, domain.ErrUnauthorized
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
		Keys: oneKey{"tgk_good", map[string]domain.KeyAccess{
			"tgk_reader": {ID: 2, Name: "reader", Scopes: []domain.Scope{domain.ScopeConnectionsRead}},
			"tgk_tenant": {ID: 3, Name: "tenant", Scopes: domain.AllScopes[:4], Connections: []string{"tenant-a-*"}}, // all but admin
			"tgk_none":   {ID: 4, Name: "none", Scopes: []domain.Scope{}},
		}},
		Sessions: noSessions{},
		Flows:    noFlows{},
		DB:       okPinger{},
		OAuth: &oauth2.Config{ClientID: "c", RedirectURL: "http://127.0.0.1:8080/oauth/callback",
			Endpoint: oauth2.Endpoint{AuthURL: "http://p/auth", TokenURL: "http://p/token"}},
		Metrics: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("metrics")) }),
		Edges:   e,
	})
}

var local = Edges{Hosts: []string{"127.0.0.1:8080"}, ReturnURLs: []string{"http://app.example/"}}

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
		if !slices.Contains(domain.AllScopes, rt.scope) {
			t.Errorf("%s: scope %q, want one of %v: every route that takes a key names its scope", id, rt.scope, domain.AllScopes)
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
	for _, rt := range s.routes() {
		if _, public := publicRoutes[rt.pattern()]; public && rt.scope != "" {
			t.Errorf("public route %s names scope %q", rt.pattern(), rt.scope)
		}
	}
	if len(publicRoutes) != 6 {
		t.Errorf("public routes: %v, want /healthz, /openapi.json, /.well-known/jwks.json, GET and POST /oauth/connect, /oauth/callback only", publicRoutes)
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
	h := s.guard(route{"GET", "/new", open, "", 0, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(200) }})
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
	h := s.guard(route{"POST", "/connect-sessions", apiKey, domain.ScopeConnect, 10, func(w http.ResponseWriter, r *http.Request) {
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
		// Read as another path by a browser or a proxy: refused before
		// the prefix comparison, which each of these would pass.
		"https://app.example.com/settings/../admin":          false,
		"https://app.example.com/settings/./x":               false,
		"https://app.example.com/settings/%2e%2e/admin":      false,
		"https://app.example.com/settings/%2E./admin":        false,
		"https://app.example.com/settings/.%2e/admin":        false,
		"https://app.example.com/settings/%252e%252e/admin":  false,
		"https://app.example.com/settings/..%2fadmin":        false,
		"https://app.example.com/settings/%2f%2fevil.com":    false,
		"https://app.example.com/settings/\\evil.com":        false,
		"https://app.example.com/settings/..\\admin":         false,
		"https://app.example.com/settings/%5c%5cevil.com":    false,
		"https://app.example.com/settings/x\ty":              false,
		"https://app.example.com/settings/x\r\nSet-Cookie:a": false,
		"https://app.example.com/settings/x%00":              false,
		"https://app.example.com/settings/caf%C3%A9":         true,
		"https://app.example.com/settings/a%20b?next=..":     true,
	} {
		if got := returnAllowed(target, allowed); got != want {
			t.Errorf("returnAllowed(%q) = %t, want %t", target, got, want)
		}
	}
}

// TestScopesAndPatterns: a key without a route's scope gets 403 naming
// the scope; a key whose patterns miss the connection gets 403 naming the
// connection and its patterns; a key with both passes the check (and
// reaches the handler, here a 503 or 404 of the absent dependencies). A
// route that names no scope refuses even a key with every right.
func TestScopesAndPatterns(t *testing.T) {
	s := testServer(local)
	// Every route of the table behind its real guard, with a handler that
	// answers 200: what is checked is the guard.
	stub := http.NewServeMux()
	for _, rt := range s.routes() {
		rt.handle = func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }
		stub.Handle(rt.pattern(), s.guard(rt))
	}
	do := func(h http.Handler, key, method, path, body string) (int, errorBody) {
		req := httptest.NewRequest(method, "http://127.0.0.1:8080"+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		var f errorBody
		if w.Code == http.StatusForbidden {
			if err := json.Unmarshal(w.Body.Bytes(), &f); err != nil || w.Header().Get("Tokenguard-Error") != f.Code || f.Error == "" {
				t.Errorf("%s %s: 403 %s, header %q", method, path, w.Body, w.Header().Get("Tokenguard-Error"))
			}
		}
		return w.Code, f
	}
	for _, rt := range s.routes() {
		if rt.access != apiKey {
			continue
		}
		method := rt.method
		if method == "" {
			method = "GET"
		}
		code, f := do(stub, "tgk_none", method, sample(rt.path), "{}")
		if code != http.StatusForbidden || f.Code != "missing_scope" || f.MissingScope != rt.scope {
			t.Errorf("%s with a key of no scope: %d %+v, want 403 missing_scope %s", rt.pattern(), code, f, rt.scope)
		}
		if code, _ := do(stub, "tgk_good", method, sample(rt.path), "{}"); code != http.StatusOK {
			t.Errorf("%s with a key of every right: %d, want 200", rt.pattern(), code)
		}
		// The scope alone is not enough on a route of one connection.
		if strings.Contains(rt.path, "{name}") {
			code, f = do(stub, "tgk_tenant", method, sample(rt.path), "{}")
			if code != http.StatusForbidden || f.Code != "connection_not_allowed" || f.Connection != "acme" ||
				!slices.Equal(f.Allowed, []string{"tenant-a-*"}) {
				t.Errorf("%s for acme with a tenant-a-* key: %d %+v", rt.pattern(), code, f)
			}
			if code, _ = do(stub, "tgk_tenant", method, strings.Replace(sample(rt.path), "acme", "tenant-a-crm", 1), "{}"); code != http.StatusOK {
				t.Errorf("%s for tenant-a-crm with a tenant-a-* key: %d, want 200", rt.pattern(), code)
			}
		}
	}
	// The reader lists, and may do nothing else.
	if code, _ := do(stub, "tgk_reader", "GET", "/connections", ""); code != http.StatusOK {
		t.Errorf("GET /connections with connections:read: %d", code)
	}
	if code, f := do(stub, "tgk_reader", "GET", "/metrics", ""); code != http.StatusForbidden || f.MissingScope != domain.ScopeAdmin {
		t.Errorf("GET /metrics with connections:read: %d %+v", code, f)
	}
	// Connect sessions, real handler: the pattern applies to the body's
	// connection, and allow_account_change needs admin.
	h := s.Handler()
	if code, f := do(h, "tgk_tenant", "POST", "/connect-sessions", `{"connection":"acme","return_to":"http://app.example/done"}`); code != http.StatusForbidden || f.Code != "connection_not_allowed" {
		t.Errorf("a session for acme with a tenant-a-* key: %d %+v", code, f)
	}
	if code, f := do(h, "tgk_tenant", "POST", "/connect-sessions", `{"connection":"tenant-a-crm","allow_account_change":true,"return_to":"http://app.example/done"}`); code != http.StatusForbidden || f.MissingScope != domain.ScopeAdmin {
		t.Errorf("allow_account_change without admin: %d %+v", code, f)
	}
	if code, _ := do(h, "tgk_tenant", "POST", "/connect-sessions", `{"connection":"tenant-a-crm","return_to":"http://app.example/done"}`); code != http.StatusCreated {
		t.Errorf("a session for tenant-a-crm with a tenant-a-* key: %d, want 201", code)
	}
	if code, _ := do(h, "tgk_good", "POST", "/connect-sessions", `{"connection":"acme","allow_account_change":true,"return_to":"http://app.example/done"}`); code != http.StatusCreated {
		t.Errorf("allow_account_change with a key of every right: %d, want 201", code)
	}
	// Fail-closed: a route that names no scope refuses every key.
	if code, _ := do(s.guard(route{"GET", "/unscoped", apiKey, "", 0, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(200) }}),
		"tgk_good", "GET", "/unscoped", ""); code != http.StatusForbidden {
		t.Errorf("a route without a scope, key with every right: %d, want 403", code)
	}
}

// TestFlowCookieSecure: the flow cookie is Secure and __Host- whenever the
// browser comes over https, at PUBLIC_URL or at the redirect URL; over
// plain http on both (the control) it is neither.
func TestFlowCookieSecure(t *testing.T) {
	pub, _ := url.Parse("https://tg.example.com")
	for _, c := range []struct {
		redirect string
		public   *url.URL
		secure   bool
	}{
		{"http://127.0.0.1:8080/oauth/callback", nil, false},
		{"https://tg.example.com/oauth/callback", nil, true},
		{"http://127.0.0.1:8080/oauth/callback", pub, true},
	} {
		// The consent page sets the flow cookie its button's token is bound to.
		s := flowServer(oneSession{sess: domain.ConnectSession{Connection: "acme", ReturnTo: "http://app.example/done"}}, noFlows{})
		s.deps.Edges.PublicURL = c.public
		s.deps.OAuth.RedirectURL = c.redirect
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, httptest.NewRequest("GET", "http://127.0.0.1:8080/oauth/connect?session=tgs_good", nil))
		set := w.Header().Get("Set-Cookie")
		if got := strings.HasPrefix(set, "__Host-tokenguard_flow=") && strings.Contains(set, "; Secure"); got != c.secure ||
			(!c.secure && strings.Contains(set, "Secure")) {
			t.Errorf("redirect %s, PUBLIC_URL %v: Set-Cookie %q, want secure %t", c.redirect, c.public, set, c.secure)
		}
	}
}

// TestConsoleLimitedPerAddress is finding 3's flood, one address: the
// console's requests beyond the address's rate are 429 before the console
// (and its database work) runs; another address still gets in, and the
// API's public routes keep their own budget.
func TestConsoleLimitedPerAddress(t *testing.T) {
	e := local
	e.PublicRate, e.PublicBurst = 1, 5
	s := testServer(e)
	var served atomic.Int32
	s.MountConsole(countingConsole{&served})
	h := s.Handler()
	get := func(addr, path string) int {
		req := httptest.NewRequest("GET", "http://127.0.0.1:8080"+path, nil)
		req.RemoteAddr = addr + ":40000"
		req.AddCookie(&http.Cookie{Name: "tokenguard_console", Value: "tgc_bogus"})
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code
	}
	refused := 0
	for range 200 {
		if get("203.0.113.7", "/console/connections") == http.StatusTooManyRequests {
			refused++
		}
	}
	if n := served.Load(); n > 10 || refused < 190 {
		t.Errorf("200 console requests from one address: %d reached the console, %d refused", n, refused)
	}
	if code := get("203.0.113.8", "/console/connections"); code != http.StatusOK {
		t.Errorf("control: another address: %d", code)
	}
	if code := get("203.0.113.7", "/healthz"); code != http.StatusOK {
		t.Errorf("the flooding address's /healthz (the public routes' own budget): %d", code)
	}
}

// countingConsole counts the requests that reach it.
type countingConsole struct{ served *atomic.Int32 }

func (c countingConsole) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	c.served.Add(1)
	w.WriteHeader(http.StatusOK)
}

func (countingConsole) TooManyRequests(w http.ResponseWriter, _ *http.Request) {
	w.WriteHeader(http.StatusTooManyRequests)
}

// TestConsoleRefusedInHTML: a console request the address's limit refuses
// is answered with the console's own page (HTML, its stylesheet and
// headers, Retry-After), not the API's JSON; an API route refused by the
// same kind of limit keeps the JSON problem. The refused request reads
// nothing: the console's stores are nil.
func TestConsoleRefusedInHTML(t *testing.T) {
	e := local
	e.PublicRate, e.PublicBurst = 1, 1
	s := testServer(e)
	s.MountConsole(console.New(console.Deps{}))
	h := s.Handler()
	send := func(path string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", "http://127.0.0.1:8080"+path, nil)
		req.RemoteAddr = "203.0.113.9:40000"
		req.Header.Set("Accept", "text/html")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	var w *httptest.ResponseRecorder
	for range 5 { // the login form reads nothing either: the bucket empties
		if w = send("/console/login"); w.Code == http.StatusTooManyRequests {
			break
		}
	}
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("5 console requests at 1/s, burst 1: last %d, want 429", w.Code)
	}
	body := w.Body.String()
	if ct := w.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/html") {
		t.Errorf("console 429: Content-Type %q, want HTML", ct)
	}
	if ra := w.Header().Get("Retry-After"); ra == "" {
		t.Error("console 429: no Retry-After")
	}
	for _, want := range []string{"/console/static/console.css", "Too Many Requests", "Too many requests from your address"} {
		if !strings.Contains(body, want) {
			t.Errorf("console 429 page lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, `"rate_limited"`) {
		t.Errorf("console 429 is the API's JSON:\n%s", body)
	}
	if csp := w.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'none'") {
		t.Errorf("console 429: CSP %q, want the console's", csp)
	}
	// The API's public routes, refused by their own limit: JSON.
	for range 5 {
		if w = send("/openapi.json"); w.Code == http.StatusTooManyRequests {
			break
		}
	}
	if w.Code != http.StatusTooManyRequests || !strings.Contains(w.Header().Get("Content-Type"), "json") ||
		!strings.Contains(w.Body.String(), `"rate_limited"`) {
		t.Errorf("API route refused: %d %q %s, want 429 JSON rate_limited", w.Code, w.Header().Get("Content-Type"), w.Body.String())
	}
}
