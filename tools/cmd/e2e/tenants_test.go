package e2e

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
	"time"
)

// testTenantIsolation is the review's findings 1 and 2 against the real
// server and sandbox, keys limited to tenant-a-*: the connect result of
// tenant-b-2 redeemed with tenant A's key is 403 connection_not_allowed,
// nothing stored, and the result stays for a key that may (the control, a
// key of every right, redeems it); tenant A's admin key in the console
// (over HTTP, as a browser's form posts) does not list tenant B's
// connections, and its disconnect of tenant-b-2 is 403 with the connection
// untouched (the control: its own connection's page opens).
func testTenantIsolation(t *testing.T, bin string) {
	s := newStack(t, bin, stackOpts{lifetime: time.Hour, skew: 30 * time.Second})
	s.migrate()
	s.importGrant("tenant-a-1")
	server := s.start("server")
	s.waitHealthy(server)
	mk := func(name string, args ...string) string {
		t.Helper()
		r := run(t, bin, "tokenctl", s.env, "", append([]string{"apikey", "create", "--name", name}, args...)...)
		key := strings.TrimSpace(r.stdout)
		if r.code != 0 || !strings.HasPrefix(key, "tgk_") {
			t.Fatalf("apikey create %s %v: %d %s", name, args, r.code, r.stderr)
		}
		return key
	}
	tenantA := mk("tenant-a", "--connections", "tenant-a-*", "--scopes", "connect")
	adminA := mk("tenant-a-admin", "--connections", "tenant-a-*", "--scopes", "admin")

	// Finding 1: the redeem step.
	resp, body := press(t, personAt(s, "sandbox-user", "api"), s.connectSession("tenant-b-2", ""))
	back := returned(resp)
	if back == nil || back.Query().Get("status") != "pending" {
		t.Fatalf("consent for tenant-b-2: %s %.300s", resp.Status, body)
	}
	result := back.Query().Get("result")
	if code, _, raw := s.redeem(tenantA, result); code != http.StatusForbidden || !strings.Contains(raw, `"connection_not_allowed"`) {
		t.Errorf("tenant A's key redeeming tenant-b-2's result: %d %s, want 403 connection_not_allowed", code, raw)
	}
	expectJSONError(t, s, http.MethodGet, "/connections/tenant-b-2/token", http.StatusNotFound, "not_found")
	if code, r, raw := s.redeem(s.key, result); code != http.StatusOK || r.Connection != "tenant-b-2" {
		t.Fatalf("control: the key of every right redeems the same result: %d %s", code, raw)
	}

	// Finding 2: the console.
	c := consoleLogin(t, s, adminA)
	page := consoleBody(t, c, s, http.MethodGet, "/console/connections", nil, http.StatusOK)
	if strings.Contains(page, "tenant-b-2") || !strings.Contains(page, "tenant-a-1") {
		t.Errorf("tenant A's console lists:\n%s", page)
	}
	own := consoleBody(t, c, s, http.MethodGet, "/console/connections/tenant-a-1", nil, http.StatusOK)
	csrf := csrfField.FindStringSubmatch(own)
	if csrf == nil {
		t.Fatalf("no CSRF token on tenant-a-1's page")
	}
	consoleBody(t, c, s, http.MethodGet, "/console/connections/tenant-b-2", nil, http.StatusForbidden)
	consoleBody(t, c, s, http.MethodPost, "/console/connections/tenant-b-2/disconnect", url.Values{"csrf": {csrf[1]}}, http.StatusForbidden)
	expectStatus(t, s, s.key, http.MethodGet, "/connections/tenant-b-2/token", "", http.StatusOK)
	s.stop(server)
}

// consoleLogin logs key in to the console as the login form does, and
// returns a client holding the session cookie.
func consoleLogin(t *testing.T, s *stack, key string) *http.Client {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	form := consoleBody(t, c, s, http.MethodGet, "/console/login", nil, http.StatusOK)
	csrf := csrfField.FindStringSubmatch(form)
	if csrf == nil {
		t.Fatalf("login form without a CSRF token:\n%s", form)
	}
	consoleBody(t, c, s, http.MethodPost, "/console/login", url.Values{"csrf": {csrf[1]}, "key": {key}}, http.StatusSeeOther)
	return c
}

// consoleBody sends a console request with c's cookies and checks its status.
func consoleBody(t *testing.T, c *http.Client, s *stack, method, path string, form url.Values, want int) string {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+s.addr+path, strings.NewReader(form.Encode()))
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	_, _ = io.Copy(&b, resp.Body)
	if resp.StatusCode != want {
		t.Errorf("%s %s: %d, want %d\n%.400s", method, path, resp.StatusCode, want, b.String())
	}
	return b.String()
}
