package console

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// The fakes stand for the stores, to check the handler's own rules: which
// page needs what, and that no page carries inline script or style.
// tools/cmd/e2e TestConsoleInBrowser runs the console on the real ones.

type fakeKeys struct{}

func (fakeKeys) Verify(_ context.Context, k domain.Secret) (domain.KeyAccess, error) {
	switch k.Reveal() {
	case "tgk_ops":
		return domain.KeyAccess{ID: 7, Name: "ops"}, nil
	case "tgk_reader":
		return domain.KeyAccess{ID: 8, Name: "reader", Scopes: []domain.Scope{domain.ScopeConnectionsRead}}, nil
	}
	return domain.KeyAccess{}, domain.ErrUnauthorized
}

type fakeSessions map[string]domain.KeyAccess

func (f fakeSessions) Create(_ context.Context, id int32, d time.Duration) (domain.Secret, time.Time, error) {
	tok := "tgc_" + rand.Text()
	f[tok] = domain.KeyAccess{ID: id, Name: "ops"}
	return domain.NewSecret(tok), time.Now().Add(d), nil
}
func (f fakeSessions) Lookup(_ context.Context, t domain.Secret) (domain.KeyAccess, error) {
	if s, ok := f[t.Reveal()]; ok {
		return s, nil
	}
	return domain.KeyAccess{}, domain.ErrUnauthorized
}
func (f fakeSessions) Delete(_ context.Context, t domain.Secret) error {
	delete(f, t.Reveal())
	return nil
}

type fakeStore struct {
	actions []string
	conn    *domain.Connection       // nil: sample
	events  []domain.ConnectionEvent // nil: one needs_reauth refresh
}

var sample = domain.Connection{Name: "acme", Provider: "crm", Status: domain.StatusNeedsReauth, StatusReason: "invalid_grant",
	Expiry: time.Now().Add(time.Minute), ObtainedAt: time.Now().Add(-time.Hour), Version: 3,
	Binding:  domain.Binding{Account: "u-1", Scopes: "api"},
	Metadata: domain.Metadata{Object: json.RawMessage(`{"tenant":"t1"}`), Tags: []string{"eu"}}}

func (f *fakeStore) FilteredConnectionsPage(context.Context, domain.ConnectionFilter, string, int) ([]domain.Connection, error) {
	return []domain.Connection{sample}, nil
}
func (f *fakeStore) Connection(_ context.Context, name string) (domain.Connection, error) {
	if name != "acme" {
		return domain.Connection{}, domain.ErrNotFound
	}
	if f.conn != nil {
		return *f.conn, nil
	}
	return sample, nil
}
func (f *fakeStore) Recent(context.Context, string, int) ([]domain.ConnectionEvent, error) {
	if f.events != nil {
		return f.events, nil
	}
	return []domain.ConnectionEvent{{Kind: "refresh", Outcome: "needs_reauth", Reason: "invalid_grant", Duration: 80 * time.Millisecond, At: time.Now()}}, nil
}
func (f *fakeStore) LastRefreshes(context.Context, []string) (map[string]domain.ConnectionEvent, error) {
	return map[string]domain.ConnectionEvent{"acme": {Kind: "refresh", Outcome: "ok"}}, nil
}
func (f *fakeStore) RefreshRates(context.Context, time.Time) (map[string]domain.RefreshRate, error) {
	return map[string]domain.RefreshRate{"crm": {Provider: "crm", OK: 9, Total: 10}}, nil
}
func (f *fakeStore) Reactivate(_ context.Context, name, _ string) (domain.Token, int64, error) {
	f.actions = append(f.actions, "reactivate "+name)
	return domain.Token{}, 4, nil
}
func (f *fakeStore) Disconnect(_ context.Context, name string, revoke bool) (domain.Token, error) {
	f.actions = append(f.actions, "disconnect "+name)
	return domain.Token{}, nil
}
func (f *fakeStore) ConnectLink(_ context.Context, name, provider, by, _ string) (string, time.Time, error) {
	f.actions = append(f.actions, "link "+name+" "+provider+" "+by)
	return "http://x/oauth/connect?session=tgs_1", time.Now().Add(10 * time.Minute), nil
}
func (f *fakeStore) Providers(context.Context) ([]Provider, error) {
	return []Provider{{TokenURL: "http://p/token", ClientID: "c", AuthStyle: "auto"}, {Name: "crm", TokenURL: "http://crm/token", AuthStyle: "auto", LearnedAuth: "params"}}, nil
}

func newTestConsole() (*Console, *fakeStore, fakeSessions) {
	store, sessions := &fakeStore{}, fakeSessions{}
	return New(Deps{Keys: fakeKeys{}, Sessions: sessions, Connections: store, History: store, Actions: store, Links: store, Providers: store.Providers}), store, sessions
}

func do(c *Console, method, target, cookie string, form url.Values) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, target, strings.NewReader(form.Encode()))
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if cookie != "" {
		req.AddCookie(&http.Cookie{Name: sessionCookie, Value: cookie})
	}
	w := httptest.NewRecorder()
	c.ServeHTTP(w, req)
	return w
}

func TestEveryPageNeedsASessionAndEveryPostItsToken(t *testing.T) {
	c, store, sessions := newTestConsole()
	tok, _, _ := sessions.Create(context.Background(), 7, time.Hour)
	gets := []string{"/console/connections", "/console/connections/acme", "/console/connections/acme/disconnect", "/console/providers"}
	posts := []string{"/console/connections/acme/reconnect", "/console/connections/acme/reactivate", "/console/connections/acme/disconnect", "/console/logout"}
	for _, p := range gets {
		if w := do(c, "GET", p, "", nil); w.Code != http.StatusSeeOther || !strings.HasPrefix(w.Header().Get("Location"), "/console/login?next=") {
			t.Errorf("GET %s without a session: %d %s", p, w.Code, w.Header().Get("Location"))
		}
		if w := do(c, "GET", p, "tgc_unknown", nil); w.Code != http.StatusSeeOther {
			t.Errorf("GET %s with an unknown session: %d", p, w.Code)
		}
		w := do(c, "GET", p, tok.Reveal(), nil)
		if w.Code != http.StatusOK {
			t.Errorf("control: GET %s with the session: %d", p, w.Code)
		}
		checkPage(t, p, w)
	}
	csrf := csrfOf(tok.Reveal())
	for _, p := range posts {
		if w := do(c, "POST", p, "", url.Values{"csrf": {csrf}, "confirm": {"acme"}}); w.Code != http.StatusUnauthorized {
			t.Errorf("POST %s without a session: %d", p, w.Code)
		}
		if w := do(c, "POST", p, tok.Reveal(), url.Values{"confirm": {"acme"}}); w.Code != http.StatusForbidden {
			t.Errorf("POST %s without the CSRF token: %d", p, w.Code)
		}
		if w := do(c, "POST", p, tok.Reveal(), url.Values{"csrf": {csrfOf("tgc_other")}, "confirm": {"acme"}}); w.Code != http.StatusForbidden {
			t.Errorf("POST %s with another session's CSRF token: %d", p, w.Code)
		}
	}
	if len(store.actions) != 0 {
		t.Fatalf("refused posts ran %v", store.actions)
	}
	// A disconnection without the confirmation page's field asks there.
	if w := do(c, "POST", "/console/connections/acme/disconnect", tok.Reveal(), url.Values{"csrf": {csrf}}); w.Code != http.StatusSeeOther ||
		w.Header().Get("Location") != "/console/connections/acme/disconnect" || len(store.actions) != 0 {
		t.Errorf("disconnect without confirmation: %d %s %v", w.Code, w.Header().Get("Location"), store.actions)
	}
	for _, p := range posts {
		w := do(c, "POST", p, tok.Reveal(), url.Values{"csrf": {csrf}, "confirm": {"acme"}})
		if w.Code != http.StatusOK && w.Code != http.StatusSeeOther {
			t.Errorf("control: POST %s with its token: %d %s", p, w.Code, w.Body)
		}
		checkPage(t, p, w)
	}
	want := "link acme crm ops,reactivate acme,disconnect acme"
	if got := strings.Join(store.actions, ","); got != want {
		t.Errorf("actions: %s, want %s", got, want)
	}
	// Logged out: the cookie is refused.
	if w := do(c, "GET", "/console/connections", tok.Reveal(), nil); w.Code != http.StatusSeeOther {
		t.Errorf("GET after logout: %d", w.Code)
	}
}

func TestLogin(t *testing.T) {
	c, _, sessions := newTestConsole()
	w := do(c, "GET", "/console/login?next=/console/providers", "", nil)
	checkPage(t, "login", w)
	var pre *http.Cookie
	for _, ck := range w.Result().Cookies() {
		if ck.Name == loginCookie {
			pre = ck
		}
	}
	if pre == nil || !pre.HttpOnly || pre.SameSite != http.SameSiteStrictMode {
		t.Fatalf("pre-login cookie %+v", pre)
	}
	post := func(form url.Values, withCookie bool) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/console/login", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if withCookie {
			req.AddCookie(pre)
		}
		w := httptest.NewRecorder()
		c.ServeHTTP(w, req)
		return w
	}
	good := url.Values{"csrf": {csrfOf(pre.Value)}, "key": {"tgk_ops"}, "next": {"/console/providers"}}
	if w := post(url.Values{"key": {"tgk_ops"}}, true); w.Code != http.StatusForbidden {
		t.Errorf("login without the form's token: %d", w.Code)
	}
	if w := post(good, false); w.Code != http.StatusForbidden {
		t.Errorf("login without the pre-login cookie: %d", w.Code)
	}
	if w := post(url.Values{"csrf": {csrfOf(pre.Value)}, "key": {"tgk_wrong"}}, true); w.Code != http.StatusUnauthorized || len(sessions) != 0 {
		t.Errorf("login with a wrong key: %d, %d sessions", w.Code, len(sessions))
	}
	if w := post(url.Values{"csrf": {csrfOf(pre.Value)}, "key": {"tgk_reader"}}, true); w.Code != http.StatusForbidden || len(sessions) != 0 {
		t.Errorf("login with a key without the admin scope: %d, %d sessions", w.Code, len(sessions))
	}
	w = post(good, true)
	if w.Code != http.StatusSeeOther || w.Header().Get("Location") != "/console/providers" || len(sessions) != 1 {
		t.Fatalf("login: %d %s, %d sessions", w.Code, w.Header().Get("Location"), len(sessions))
	}
	var session *http.Cookie
	for _, ck := range w.Result().Cookies() {
		if ck.Name == sessionCookie {
			session = ck
		}
	}
	if session == nil || !session.HttpOnly || session.Secure || session.SameSite != http.SameSiteStrictMode || session.MaxAge < 7*3600 {
		t.Fatalf("session cookie %+v", session)
	}
	if _, ok := sessions[session.Value]; !ok {
		t.Error("the cookie is not the stored session's token")
	}
}

func TestSecureCookiesOverHTTPS(t *testing.T) {
	c := New(Deps{Secure: true, Keys: fakeKeys{}, Sessions: fakeSessions{}})
	w := do(c, "GET", "/console/login", "", nil)
	ck := w.Result().Cookies()
	if len(ck) != 1 || ck[0].Name != "__Host-"+loginCookie || !ck[0].Secure || ck[0].Path != "/" || ck[0].Domain != "" {
		t.Errorf("cookies over https: %+v", ck)
	}
}

func TestSafeNext(t *testing.T) {
	for in, want := range map[string]string{
		"/console/providers":  "/console/providers",
		"":                    "/console/connections",
		"https://evil/":       "/console/connections",
		"//evil/console/":     "/console/connections",
		"/console//evil":      "/console/connections",
		"/console/\\evil":     "/console/connections",
		"/metrics":            "/console/connections",
		"/console/x?status=a": "/console/x?status=a",
	} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
}

// checkPage: the console's headers, and no inline script or style.
func checkPage(t *testing.T, what string, w *httptest.ResponseRecorder) {
	t.Helper()
	h := w.Header()
	if h.Get("Content-Security-Policy") != csp || h.Get("Cache-Control") != "no-store" || h.Get("X-Frame-Options") != "DENY" {
		t.Errorf("%s headers: %v", what, h)
	}
	body := w.Body.String()
	for _, bad := range []string{"<script", "style=", "<style", "javascript:", " on"} {
		if bad == " on" {
			for _, attr := range []string{" onclick=", " onload=", " onsubmit="} {
				if strings.Contains(body, attr) {
					t.Errorf("%s has an inline handler %s", what, attr)
				}
			}
			continue
		}
		if strings.Contains(body, bad) {
			t.Errorf("%s contains %q", what, bad)
		}
	}
}

func TestShort(t *testing.T) {
	for d, want := range map[time.Duration]string{
		300 * time.Millisecond:          "now",
		1500 * time.Millisecond:         "2s",
		59*time.Minute + 40*time.Second: "1h",
		59*time.Minute + 20*time.Second: "59m",
		5*24*time.Hour - 10*time.Second: "5d",
		47*time.Hour + 10*time.Minute:   "47h",
		47*time.Hour + 40*time.Minute:   "2d",
	} {
		if got := short(d); got != want {
			t.Errorf("short(%v) = %q, want %q", d, got, want)
		}
	}
}

// consoleRows says which console actions name a connection (acme, in the
// path) and which list connections. An action added without a row fails
// TestConsoleAuthorizationTable.
var consoleRows = map[string]struct{ names, listing bool }{
	"POST /console/logout":                        {},
	"GET /console/connections":                    {listing: true},
	"GET /console/connections/{name}":             {names: true},
	"POST /console/connections/{name}/reconnect":  {names: true},
	"POST /console/connections/{name}/reactivate": {names: true},
	"GET /console/connections/{name}/disconnect":  {names: true},
	"POST /console/connections/{name}/disconnect": {names: true},
	"GET /console/providers":                      {},
}

// TestConsoleAuthorizationTable walks every console action with a
// session of each key shape: without the admin scope (403), admin limited
// to tenant-b-* (403 on acme's pages and forms, nothing done; the listing
// without acme), admin allowed acme (the action runs). Finding 2 of the
// review: an admin key limited by patterns acted on every connection.
func TestConsoleAuthorizationTable(t *testing.T) {
	shapes := []struct {
		name   string
		access domain.KeyAccess
	}{
		{"no admin", domain.KeyAccess{Scopes: []domain.Scope{domain.ScopeConnectionsRead}}},
		{"tenant-b-*", domain.KeyAccess{Scopes: []domain.Scope{domain.ScopeAdmin}, Connections: []string{"tenant-b-*"}}},
		{"ac*", domain.KeyAccess{Scopes: []domain.Scope{domain.ScopeAdmin}, Connections: []string{"ac*"}}},
	}
	c, _, _ := newTestConsole()
	for _, a := range c.actions() {
		row, ok := consoleRows[a.pattern]
		if !ok {
			t.Errorf("console action %s has no row in consoleRows", a.pattern)
			continue
		}
		method, path, _ := strings.Cut(a.pattern, " ")
		path = strings.ReplaceAll(path, "{name}", "acme")
		for _, sh := range shapes {
			c, store, sessions := newTestConsole()
			tok := "tgc_" + sh.name
			sh.access.ID, sh.access.Name = 9, sh.name
			sessions[tok] = sh.access
			w := do(c, method, path, tok, url.Values{"csrf": {csrfOf(tok)}})
			refused := w.Code == http.StatusForbidden
			switch want := sh.name == "no admin" || (sh.name == "tenant-b-*" && row.names); {
			case want != refused:
				t.Errorf("%s, key %s: %d, want refused %t", a.pattern, sh.name, w.Code, want)
			case refused && len(store.actions) > 0:
				t.Errorf("%s, key %s: refused but did %v", a.pattern, sh.name, store.actions)
			case row.listing && !refused && strings.Contains(w.Body.String(), "/console/connections/acme") != (sh.name == "ac*"):
				t.Errorf("%s, key %s: acme listed %t", a.pattern, sh.name, !(sh.name == "ac*"))
			}
		}
	}
	for p := range consoleRows {
		if !slices.ContainsFunc(c.actions(), func(a action) bool { return a.pattern == p }) {
			t.Errorf("consoleRows names %s, which is not a console action", p)
		}
	}
}

// TestLoginTriesPerForm: one login form (its pre-login cookie and CSRF
// token) replayed with wrong keys is refused after a few attempts, before
// any key is checked; a fresh form gets its own (the control).
func TestLoginTriesPerForm(t *testing.T) {
	c, _, _ := newTestConsole()
	codes := map[int]int{}
	for range 50 {
		codes[postLogin(c, "192.0.2.1", "form-1", "tgk_wrong").Code]++
	}
	if codes[http.StatusUnauthorized] != maxLoginTries || codes[http.StatusTooManyRequests] != 50-maxLoginTries {
		t.Errorf("50 wrong keys with one form: %v", codes)
	}
	if code := postLogin(c, "192.0.2.2", "form-2", "tgk_wrong").Code; code != http.StatusUnauthorized {
		t.Errorf("control: a fresh form: %d, want 401", code)
	}
}

// postLogin posts the login form of pre-login cookie pre with key, from
// address addr.
func postLogin(c *Console, addr, pre, key string) *httptest.ResponseRecorder {
	req := httptest.NewRequest("POST", "/console/login", strings.NewReader(url.Values{"csrf": {csrfOf(pre)}, "key": {key}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.RemoteAddr = addr + ":40000"
	req.AddCookie(&http.Cookie{Name: loginCookie, Value: pre})
	w := httptest.NewRecorder()
	c.ServeHTTP(w, req)
	return w
}

// countingKeys counts the keys checked.
type countingKeys struct {
	fakeKeys
	n *int
}

func (k countingKeys) Verify(ctx context.Context, key domain.Secret) (domain.KeyAccess, error) {
	*k.n++
	return k.fakeKeys.Verify(ctx, key)
}

// TestLoginTriesPerAddress: an attacker who makes a fresh login form for
// each try (the per-form count never stops him) is refused per address
// after a burst, with the console's 429 page and Retry-After, before any
// key is checked; another address still logs in (the control), and the
// first one again once its budget refills.
func TestLoginTriesPerAddress(t *testing.T) {
	checked := 0
	now := time.Now()
	c := New(Deps{Keys: countingKeys{n: &checked}, Sessions: fakeSessions{}, Now: func() time.Time { return now }})
	codes := map[int]int{}
	var last *httptest.ResponseRecorder
	for i := range 50 {
		last = postLogin(c, "198.51.100.7", fmt.Sprintf("form-%d", i), "tgk_wrong")
		codes[last.Code]++
	}
	if codes[http.StatusUnauthorized] != loginBurst || codes[http.StatusTooManyRequests] != 50-loginBurst || checked != loginBurst {
		t.Errorf("50 wrong keys from one address, each with its own form: %v, %d keys checked; want %d checked, the rest 429", codes, checked, loginBurst)
	}
	if last.Header().Get("Retry-After") == "" || !strings.HasPrefix(last.Header().Get("Content-Type"), "text/html") ||
		!strings.Contains(last.Body.String(), "Too many requests from your address") {
		t.Errorf("refused login: %v\n%s", last.Header(), last.Body.String())
	}
	if code := postLogin(c, "198.51.100.8", "form-x", "tgk_ops").Code; code != http.StatusSeeOther {
		t.Errorf("control: another address logs in: %d, want 303", code)
	}
	now = now.Add(2 * time.Second)
	if code := postLogin(c, "198.51.100.7", "form-y", "tgk_ops").Code; code != http.StatusSeeOther {
		t.Errorf("the first address, its budget refilled: %d, want 303", code)
	}
}

// A connection still active whose last refresh was not stored says that
// its refreshes are failing, and why; Reactivate is offered only to a
// needs_reauth connection (the control: sample).
func TestConnectionPageSaysWhatFailsAndOffersWhatApplies(t *testing.T) {
	c, store, sessions := newTestConsole()
	tok, _, _ := sessions.Create(context.Background(), 7, time.Hour)
	page := func() string {
		w := do(c, "GET", "/console/connections/acme", tok.Reveal(), nil)
		checkPage(t, "connection", w)
		return w.Body.String()
	}
	if body := page(); !strings.Contains(body, "/reactivate") || strings.Contains(body, "Refreshes are failing") {
		t.Errorf("needs_reauth: want Reactivate and no failing notice:\n%s", body)
	}
	active := sample
	active.Status, active.StatusReason = domain.StatusActive, ""
	store.conn = &active
	store.events = []domain.ConnectionEvent{
		{Kind: "refresh", Outcome: "not_stored", Reason: "timeout", Duration: 10 * time.Second, At: time.Now()},
		{Kind: "refresh", Outcome: "ok", Version: 3, At: time.Now().Add(-time.Hour)},
	}
	body := page()
	if strings.Contains(body, "/reactivate") {
		t.Error("Reactivate offered to an active connection")
	}
	if !strings.Contains(body, "Refreshes are failing") || !strings.Contains(body, "<strong>timeout</strong>") {
		t.Errorf("no failing notice with its reason:\n%s", body)
	}
	store.events = store.events[1:] // the last refresh worked
	if strings.Contains(page(), "Refreshes are failing") {
		t.Error("failing notice after a successful refresh")
	}
}
