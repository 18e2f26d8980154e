package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"

	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/tools/internal/demo"
)

// chromium finds the headless browser of the console test: $CHROMIUM, else
// chromium or chromium-browser on PATH (Debian: apt-get install chromium).
// Under CI a missing browser fails the test; elsewhere it skips with one
// line.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{os.Getenv("CHROMIUM"), "chromium", "chromium-browser"} {
		if name == "" {
			continue
		}
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium not found (CI=true): apt-get install chromium")
	}
	t.Skip("chromium not found: apt-get install chromium (Debian) to run the console's browser test")
	return ""
}

// TestConsoleInBrowser drives the operator console in headless Chromium
// against the server binary and the sandbox: login, the connections
// filtered to needs_reauth, a connection's page and history, a reconnect
// link (followed through the real consent flow), a disconnection with its
// confirmation step, and the providers page. Then the session rules, by
// plain HTTP with the browser's cookie: a form post without the CSRF token
// is refused, and after logout the cookie is refused (with the controls:
// the same post with the token, and the same cookie before logout, pass).
// With CONSOLE_SCREENSHOTS=dir it saves the pages as PNG files there.
func TestConsoleInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end")
	}
	chrome := chromium(t)
	bin := buildApps(t)
	s := newStack(t, bin, stackOpts{lifetime: time.Hour, skew: 30 * time.Second})
	s.migrate()
	crmSecret, server := seedConsoleConnections(t, bin, s)

	c := openConsole(t, chrome, s)
	c.login()
	c.filters()
	c.globexPage()
	c.reconnect()
	c.disconnect()
	c.providers(crmSecret)
	c.sessionRules()
	// The browser goes first: a connection it opened ahead of a request
	// would hold the server's shutdown for 5 s.
	c.cancelBrowser()
	s.stop(server)
	if st := s.sb.Stats(); st.RefreshReuse != 0 {
		t.Errorf("refresh-token reuse at the sandbox: %d", st.RefreshReuse)
	}
}

// seedConsoleConnections adds the crm provider, starts the server, and
// stores the connections the console test looks at: globex (needs_reauth),
// acme and initech (healthy, each refreshed once), umbrella-01..04. It
// returns crm's client secret, which no page may show, and the server.
func seedConsoleConnections(t *testing.T, bin string, s *stack) (string, *app) {
	t.Helper()
	// A second provider, stored, that takes the client only in the form
	// body: auto learns it at the first refresh.
	// Its refresh tokens live 5 days: "expiring soon".
	crm, err := demo.StartSandbox("127.0.0.1:0", sandbox.Options{AccessTokenLifespan: time.Hour, ClientAuth: sandbox.ClientAuthPost,
		ExtraTokenFields: map[string]string{"refresh_token_expires_in": "432000"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(crm.Close)
	crmCfg := crm.OAuth2Config(crm.URL)
	if r := run(t, bin, "tokenctl", s.env, crmCfg.ClientSecret+"\n", "provider", "add", "--name", "crm",
		"--token-url", crmCfg.Endpoint.TokenURL, "--auth-url", crmCfg.Endpoint.AuthURL, "--client-id", crmCfg.ClientID,
		"--api-base-url", crm.URL, "--scopes", "api"); r.code != 0 {
		t.Fatalf("tokenctl provider add: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	server := s.start("server")
	s.waitHealthy(server)
	// globex is refreshed once, then its grant dies at the provider and
	// the next refresh finds out.
	s.importGrant("globex")
	s.forceRefresh("globex")
	s.sb.RevokeAll()
	s.forceRefresh("globex")
	// Healthy ones, each refreshed once so that their history has a refresh.
	s.importGrant("acme")
	s.forceRefresh("acme")
	tok, err := sandbox.Grant(context.Background(), crmCfg)
	if err != nil {
		t.Fatal(err)
	}
	js, _ := json.Marshal(tok)
	if r := run(t, bin, "tokenctl", s.env, string(js), "import", "--connection", "initech", "--provider", "crm",
		"--metadata", `{"tenant":"t-42","plan":"enterprise"}`, "--tags", "billing,eu"); r.code != 0 {
		t.Fatalf("tokenctl import --provider crm: exit %d: %s", r.code, r.stderr)
	}
	s.forceRefresh("initech")
	for i := 1; i <= 4; i++ {
		s.importGrant(fmt.Sprintf("umbrella-%02d", i))
	}
	return crmCfg.ClientSecret, server
}

// console is the headless browser of TestConsoleInBrowser, on the
// stack's console; each step fails the test saying what it was doing.
type console struct {
	t             *testing.T
	s             *stack
	base          string
	bctx          context.Context
	cancelBrowser context.CancelFunc
	shots         string // CONSOLE_SCREENSHOTS
}

func openConsole(t *testing.T, chrome string, s *stack) *console {
	t.Helper()
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chrome), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1360, 900),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-quic", true), chromedp.Flag("hide-scrollbars", true))...)
	t.Cleanup(cancelAlloc)
	bctx, cancelBrowser := chromedp.NewContext(alloc)
	t.Cleanup(cancelBrowser)
	bctx, cancelTimeout := context.WithTimeout(bctx, 2*time.Minute)
	t.Cleanup(cancelTimeout)
	return &console{t: t, s: s, base: "http://" + s.addr, bctx: bctx, cancelBrowser: cancelBrowser, shots: os.Getenv("CONSOLE_SCREENSHOTS")}
}

func (c *console) browse(what string, steps ...chromedp.Action[chromedp.Void]) {
	c.t.Helper()
	if err := chromedp.Do(c.bctx, steps...); err != nil {
		c.t.Fatalf("%s: %v", what, err)
	}
}

func (c *console) read(what string, a chromedp.Action[string]) string {
	c.t.Helper()
	out, err := chromedp.Run(c.bctx, a)
	if err != nil {
		c.t.Fatalf("%s: %v", what, err)
	}
	return out
}

func (c *console) shot(name string) {
	c.t.Helper()
	if c.shots == "" {
		return
	}
	png, err := chromedp.Run(c.bctx, chromedp.FullScreenshot(100))
	if err != nil {
		c.t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(c.shots, name), png, 0o644); err != nil {
		c.t.Fatal(err)
	}
	c.t.Logf("wrote %s", filepath.Join(c.shots, name))
}

func (c *console) text(sel string) string {
	c.t.Helper()
	return c.read("read "+sel, chromedp.Text(chromedp.CSS(sel)))
}

func (c *console) location() string { c.t.Helper(); return c.read("location", chromedp.Location()) }

func css(sel string) chromedp.CSS { return chromedp.CSS(sel) }

// 1. Login: the console sends a browser without a session to the form.
func (c *console) login() {
	t, base := c.t, c.base
	c.browse("open the console", chromedp.Navigate(base+"/console"), chromedp.WaitVisible(css(`#key`)))
	if loc := c.location(); !strings.HasPrefix(loc, base+"/console/login") {
		t.Fatalf("without a session /console went to %s, want the login form", loc)
	}
	c.browse("a wrong key", chromedp.SendKeys(css(`#key`), "tgk_wrong"), chromedp.Submit(css(`#key`)),
		chromedp.WaitVisible(css(`.notice.bad`)))
	if got := c.text(`.notice.bad`); !strings.Contains(got, "not valid") {
		t.Errorf("login with a wrong key says %q", got)
	}
	c.browse("log in", chromedp.SendKeys(css(`#key`), c.s.key), chromedp.Submit(css(`#key`)),
		chromedp.WaitVisible(css(`table.grid`)))
	all := c.text(`table.grid tbody`)
	for _, name := range []string{"acme", "globex", "initech", "umbrella-04"} {
		if !strings.Contains(all, name) {
			t.Errorf("the connections page lists no %s:\n%s", name, all)
		}
	}
	c.shot("console-connections.png")
}

// 2. Filtered to needs_reauth: globex alone, with its reason; then the
// provider, tag, expiring-soon and prefix filters, by URL.
func (c *console) filters() {
	t, base := c.t, c.base
	c.browse("filter to needs_reauth", chromedp.SetValue(css(`select[name=status]`), "needs_reauth"),
		chromedp.Click(css(`.filters button[type=submit]`)), chromedp.WaitVisible(css(`a.button[href="/console/connections"]`)))
	if loc := c.location(); !strings.Contains(loc, "status=needs_reauth") {
		t.Errorf("filtered page at %s", loc)
	}
	rows := c.text(`table.grid tbody`)
	if !strings.Contains(rows, "globex") || !strings.Contains(rows, "invalid_grant") || strings.Contains(rows, "acme") || strings.Contains(rows, "initech") {
		t.Errorf("needs_reauth rows:\n%s", rows)
	}
	// Provider and tag filters, by URL.
	c.browse("filter by provider and tag", chromedp.Navigate(base+"/console/connections?provider=crm&tag=eu"), chromedp.WaitVisible(css(`table.grid`)))
	if rows := c.text(`table.grid tbody`); !strings.Contains(rows, "initech") || strings.Contains(rows, "globex") || strings.Contains(rows, "acme") {
		t.Errorf("provider=crm&tag=eu rows:\n%s", rows)
	}
	c.browse("filter to expiring soon", chromedp.Navigate(base+"/console/connections?status=expiring_soon"), chromedp.WaitVisible(css(`table.grid`)))
	if rows := c.text(`table.grid tbody`); !strings.Contains(rows, "initech") || !strings.Contains(rows, "in 5d") || strings.Contains(rows, "acme") {
		t.Errorf("expiring_soon rows:\n%s", rows)
	}
	c.browse("filter by prefix", chromedp.Navigate(base+"/console/connections?prefix=umb"), chromedp.WaitVisible(css(`table.grid`)))
	if rows := c.text(`table.grid tbody`); strings.Count(rows, "umbrella-") != 4 || strings.Contains(rows, "acme") {
		t.Errorf("prefix=umb rows:\n%s", rows)
	}
}

// 3. globex's page: its history has the refresh that found the grant
// dead, and the needs_reauth event.
func (c *console) globexPage() {
	t := c.t
	c.browse("back to needs_reauth", chromedp.Navigate(c.base+"/console/connections?status=needs_reauth"), chromedp.WaitVisible(css(`a.name`)))
	c.browse("open globex", chromedp.Click(css(`a.name`)), chromedp.WaitVisible(css(`.facts`)))
	if h1 := c.text(`h1`); !strings.Contains(h1, "globex") || !strings.Contains(h1, "needs_reauth") {
		t.Errorf("globex's page heading: %q", h1)
	}
	history := c.text(`section.card.flush table tbody`)
	if !strings.Contains(history, "refresh") || !strings.Contains(history, "needs_reauth") || !strings.Contains(history, "connected") {
		t.Errorf("globex's history:\n%s", history)
	}
	c.shot("console-connection.png")
}

// 4. A reconnect link: a real connect session; the person's consent
// brings a result back to the application's page, whose backend
// redeems it.
func (c *console) reconnect() {
	t, s, base := c.t, c.s, c.base
	c.browse("create a reconnect link",
		chromedp.SetValue(css(`form[action$="/reconnect"] input[name=return_to]`), defaultReturnTo),
		chromedp.Click(css(`form[action$="/reconnect"] button`)), chromedp.WaitVisible(css(`#link`)))
	link := c.read("read the link", chromedp.Value(css(`#link`)))
	if !strings.HasPrefix(link, base+"/oauth/connect?session=tgs_") {
		t.Fatalf("reconnect link %q", link)
	}
	resp, body := browser(t, s, link, "", "")
	back := returned(resp)
	if back == nil || back.Query().Get("status") != "pending" || back.Query().Get("result") == "" {
		t.Fatalf("following the reconnect link: %s %s", resp.Status, body)
	}
	if code, _, body := s.redeem(s.key, back.Query().Get("result")); code != http.StatusOK {
		t.Fatalf("redeeming the reconnect's result: %d %s", code, body)
	}
	c.browse("globex again", chromedp.Navigate(base+"/console/connections/globex"), chromedp.WaitVisible(css(`.facts`)))
	if h1 := c.text(`h1`); !strings.Contains(h1, "active") {
		t.Errorf("globex after the consent: %q", h1)
	}
	if history := c.text(`section.card.flush table tbody`); !strings.Contains(history, "recovered") {
		t.Errorf("globex's history after the consent:\n%s", history)
	}
}

// 5. Disconnect, through the confirmation page.
func (c *console) disconnect() {
	t, s := c.t, c.s
	c.browse("disconnect…", chromedp.Click(css(`a.button.danger`)), chromedp.WaitVisible(css(`button.danger`)))
	if h1 := c.text(`h1`); !strings.Contains(h1, "Disconnect globex?") {
		t.Errorf("confirmation page: %q", h1)
	}
	if code, _ := s.do(http.MethodGet, "/connections/globex/token", ""); code != http.StatusOK {
		t.Fatalf("globex before the confirmation: %d", code)
	}
	c.browse("confirm", chromedp.Click(css(`button.danger`)), chromedp.WaitVisible(css(`.notice.ok`)))
	if h1 := c.text(`h1`); !strings.Contains(h1, "globex is disconnected") {
		t.Errorf("after the confirmation: %q", h1)
	}
	expectJSONError(t, s, http.MethodGet, "/connections/globex/token", http.StatusNotFound, "not_found")
	if kinds := eventKinds(t, s.dbURL, "globex"); !strings.HasPrefix(kinds, "disconnected,recovered,") {
		t.Errorf("globex's recorded history, newest first: %s", kinds)
	}
}

// 6. Providers: settings without secrets, the learned auth style, the
// last hour's refresh success.
func (c *console) providers(crmSecret string) {
	t, s := c.t, c.s
	c.browse("providers", chromedp.Navigate(c.base+"/console/providers"), chromedp.WaitVisible(css(`table.grid`)))
	provs := c.text(`table.grid tbody`)
	if !strings.Contains(provs, "OAUTH_*") || !strings.Contains(provs, "crm") || !strings.Contains(provs, "params") ||
		!strings.Contains(provs, "100%") || !strings.Contains(provs, "1 of 1") || !strings.Contains(provs, "2 of 3") {
		t.Errorf("providers page:\n%s", provs)
	}
	html := c.read("providers HTML", chromedp.OuterHTML(css(`html`)))
	if strings.Contains(html, crmSecret) || strings.Contains(html, s.sb.OAuth2Config(s.sb.URL).ClientSecret) {
		t.Error("the providers page shows a client secret")
	}
	c.shot("console-providers.png")
}

// sessionCookie is the browser's console session cookie, checked:
// HttpOnly, SameSite=Strict, a tgc_ value, lasting more than 7 hours.
func (c *console) sessionCookie() *network.Cookie {
	t := c.t
	t.Helper()
	got, err := chromedp.Call(c.bctx, network.GetCookies, network.GetCookiesParams{URLs: []string{c.base + "/console/"}})
	if err != nil {
		t.Fatal(err)
	}
	var session *network.Cookie
	for _, ck := range got.Cookies {
		if ck.Name == "tokenguard_console" {
			session = ck
		}
	}
	if session == nil || !session.HTTPOnly || session.SameSite != network.CookieSameSiteStrict || !strings.HasPrefix(session.Value, "tgc_") ||
		session.Expires <= float64(time.Now().Add(7*time.Hour).Unix()) {
		t.Fatalf("session cookie: %+v", session)
	}
	return session
}

// 7. Session and CSRF rules, by plain HTTP with the browser's cookie.
func (c *console) sessionRules() {
	t, s := c.t, c.s
	session := c.sessionCookie()
	csrf := formCSRF(t, s, session.Value, "/console/connections/acme")
	reactivate := "/console/connections/acme/reactivate"
	if code := consolePost(t, s, session.Value, reactivate, nil); code != http.StatusForbidden {
		t.Errorf("POST without the CSRF token: %d, want 403", code)
	}
	if code := consolePost(t, s, session.Value, reactivate, url.Values{"csrf": {otherToken(csrf)}}); code != http.StatusForbidden {
		t.Errorf("POST with a wrong CSRF token: %d, want 403", code)
	}
	if code := consolePost(t, s, session.Value, reactivate, url.Values{"csrf": {csrf}}); code != http.StatusSeeOther {
		t.Errorf("control: POST with the CSRF token: %d, want 303", code)
	}
	if code := consolePost(t, s, "", "/console/login", url.Values{"key": {s.key}}); code != http.StatusForbidden {
		t.Errorf("login POST without the login form's token: %d, want 403", code)
	}
	if code := consoleGet(t, s, session.Value, "/console/connections"); code != http.StatusOK {
		t.Errorf("control: the cookie before logout: %d, want 200", code)
	}
	c.browse("log out", chromedp.Click(css(`form.logout button`)), chromedp.WaitVisible(css(`#key`)))
	if code := consoleGet(t, s, session.Value, "/console/connections"); code != http.StatusSeeOther {
		t.Errorf("the logged-out cookie on a page: %d, want 303 to the login form", code)
	}
	if code := consolePost(t, s, session.Value, reactivate, url.Values{"csrf": {csrf}}); code != http.StatusUnauthorized {
		t.Errorf("the logged-out cookie on a form post with its CSRF token: %d, want 401", code)
	}
	c.browse("the console after logout", chromedp.Navigate(c.base+"/console/connections"), chromedp.WaitVisible(css(`#key`)))
}

// forceRefresh asks the server to refresh name's current token, as a
// caller whose API refused it would.
func (s *stack) forceRefresh(name string) {
	s.t.Helper()
	code, body := s.do(http.MethodGet, "/connections/"+name+"/token", "")
	var tok struct {
		Version int64 `json:"version"`
	}
	if code != http.StatusOK || json.Unmarshal([]byte(body), &tok) != nil || tok.Version == 0 {
		s.t.Fatalf("GET the token of %s: %d %s", name, code, body)
	}
	// Forced refreshes of one connection are spaced (5 s): wait out the
	// previous one.
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		code, body = s.do(http.MethodPost, "/connections/"+name+"/token/refresh", `{"stale_version":`+strconv.FormatInt(tok.Version, 10)+`}`)
		if code == http.StatusTooManyRequests && time.Now().Before(deadline) {
			continue
		}
		if code != http.StatusOK && code != http.StatusConflict {
			s.t.Fatalf("refresh %s: %d %s", name, code, body)
		}
		return
	}
}

// consoleRequest sends a console request with the session cookie value
// ("" for none), following no redirect, and returns the answer.
func consoleRequest(t *testing.T, s *stack, cookie, method, path string, form url.Values) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+s.addr+path, strings.NewReader(form.Encode()))
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if cookie != "" {
		req.AddCookie(&http.Cookie{Name: "tokenguard_console", Value: cookie})
	}
	c := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func consoleGet(t *testing.T, s *stack, cookie, path string) int {
	t.Helper()
	resp, _ := consoleRequest(t, s, cookie, http.MethodGet, path, nil)
	return resp.StatusCode
}

func consolePost(t *testing.T, s *stack, cookie, path string, form url.Values) int {
	t.Helper()
	resp, _ := consoleRequest(t, s, cookie, http.MethodPost, path, form)
	return resp.StatusCode
}

// formCSRF reads the CSRF token of a console page's forms, and checks the
// page's headers: the CSP allows no script and no inline style, and the
// page has none.
func formCSRF(t *testing.T, s *stack, cookie, path string) string {
	t.Helper()
	resp, body := consoleRequest(t, s, cookie, http.MethodGet, path, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d", path, resp.StatusCode)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") || !strings.Contains(csp, "script-src 'none'") ||
		strings.Contains(csp, "unsafe-inline") {
		t.Errorf("CSP of %s: %q", path, csp)
	}
	if strings.Contains(body, "<script") || strings.Contains(body, "style=") || strings.Contains(body, "<style") {
		t.Errorf("%s has inline script or style", path)
	}
	_, rest, ok := strings.Cut(body, `name="csrf" value="`)
	token, _, ok2 := strings.Cut(rest, `"`)
	if !ok || !ok2 || len(token) < 40 {
		t.Fatalf("no CSRF token in the forms of %s", path)
	}
	return token
}

// eventKinds is connection's recorded history, newest first.
func eventKinds(t *testing.T, dbURL, connection string) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var kinds string
	if err := conn.QueryRow(ctx, `SELECT coalesce(string_agg(kind, ',' ORDER BY id DESC), '') FROM tokenguard_connection_events WHERE connection = $1`,
		connection).Scan(&kinds); err != nil {
		t.Fatal(err)
	}
	return kinds
}

// otherToken is token with its first character changed: a token that
// differs from the real one whatever the real one is.
func otherToken(token string) string {
	if strings.HasPrefix(token, "x") {
		return "y" + token[1:]
	}
	return "x" + token[1:]
}
