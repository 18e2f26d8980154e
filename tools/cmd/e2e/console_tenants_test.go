package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// testConsoleTenantPattern: an admin key limited to tenant-a-*,
// logged in to the console in headless Chromium against the server
// binary, sees only tenant A's connections (the list, and a prefix filter
// on tenant-b), and cannot open or disconnect tenant-b-2: its page by
// direct URL is 403, and the disconnect form of its own connection, turned
// by the page's DOM into a post for tenant-b-2 (action and confirmation),
// is refused 403 with tenant-b-2's token as it was. The control: the same
// form, untouched, disconnects tenant A's own connection.
func testConsoleTenantPattern(t *testing.T, chrome, bin string) {
	s := newStack(t, bin, stackOpts{lifetime: time.Hour, skew: 30 * time.Second})
	s.migrate()
	for _, n := range []string{"tenant-a-1", "tenant-a-2", "tenant-b-1", "tenant-b-2"} {
		s.importGrant(n)
	}
	r := run(t, bin, "tokenctl", s.env, "", "apikey", "create", "--name", "tenant-a-admin", "--connections", "tenant-a-*", "--scopes", "admin")
	adminA := strings.TrimSpace(r.stdout)
	if r.code != 0 || !strings.HasPrefix(adminA, "tgk_") {
		t.Fatalf("apikey create: %d %s", r.code, r.stderr)
	}
	server := s.start("server")
	s.waitHealthy(server)
	before := s.tokenVersion("tenant-b-2")

	c := openConsole(t, chrome, s)
	c.loginAs("tenant A's admin", adminA)
	rows := c.text(`table.grid tbody`)
	if !strings.Contains(rows, "tenant-a-1") || !strings.Contains(rows, "tenant-a-2") || strings.Contains(rows, "tenant-b-") {
		t.Errorf("tenant A's console lists:\n%s", rows)
	}
	c.browse("filter by tenant B's prefix", chromedp.Navigate(c.base+"/console/connections?prefix=tenant-b"), chromedp.WaitVisible(css(`table.grid`)))
	if rows := c.text(`table.grid tbody`); strings.Contains(rows, "tenant-b-") {
		t.Errorf("tenant A's console filtered to tenant-b lists:\n%s", rows)
	}

	// Tenant B's pages by direct URL; the control, tenant A's own.
	for path, want := range map[string]int64{
		"/console/connections/tenant-b-2":            http.StatusForbidden,
		"/console/connections/tenant-b-2/disconnect": http.StatusForbidden,
		"/console/connections/tenant-a-1":            http.StatusOK,
	} {
		resp, err := chromedp.RunResponse(c.bctx, chromedp.Navigate(c.base+path))
		if err != nil {
			t.Fatalf("open %s: %v", path, err)
		}
		if resp.Status != want {
			t.Errorf("%s in the browser: %d, want %d", path, resp.Status, want)
		}
		if page := c.text(`main`); want != http.StatusOK && strings.Contains(page, "Access token expires") {
			t.Errorf("%s shows the connection:\n%s", path, page)
		}
	}

	// A form post for tenant-b-2, from tenant A's own disconnect form.
	c.browse("tenant-a-2's disconnect form", chromedp.Navigate(c.base+"/console/connections/tenant-a-2/disconnect"), chromedp.WaitVisible(css(`button.danger`)))
	if _, err := chromedp.Run(c.bctx, chromedp.Evaluate[bool](`(() => {
  const f = document.querySelector('form[action$="/disconnect"]');
  f.action = '/console/connections/tenant-b-2/disconnect';
  f.querySelector('input[name=confirm]').value = 'tenant-b-2';
  return true;
})()`)); err != nil {
		t.Fatalf("turn the form to tenant-b-2: %v", err)
	}
	resp, err := chromedp.RunResponse(c.bctx, chromedp.Click(css(`button.danger`)))
	if err != nil {
		t.Fatalf("post the form for tenant-b-2: %v", err)
	}
	if resp.Status != http.StatusForbidden || !strings.HasSuffix(resp.URL, "/console/connections/tenant-b-2/disconnect") {
		t.Errorf("disconnect of tenant-b-2 posted by tenant A's admin: %d at %s, want 403", resp.Status, resp.URL)
	}
	if after := s.tokenVersion("tenant-b-2"); after != before {
		t.Errorf("tenant-b-2's token went from version %d to %d", before, after)
	}

	// The control: the same form, untouched, does disconnect.
	c.browse("tenant-a-2's disconnect form again", chromedp.Navigate(c.base+"/console/connections/tenant-a-2/disconnect"), chromedp.WaitVisible(css(`button.danger`)))
	resp, err = chromedp.RunResponse(c.bctx, chromedp.Click(css(`button.danger`)))
	if err != nil {
		t.Fatalf("post the form for tenant-a-2: %v", err)
	}
	if resp.Status != http.StatusOK || !strings.Contains(c.text(`h1`), "tenant-a-2 is disconnected") {
		t.Errorf("control: tenant A's admin disconnecting tenant-a-2: %d, %q", resp.Status, c.text(`h1`))
	}
	expectJSONError(t, s, http.MethodGet, "/connections/tenant-a-2/token", http.StatusNotFound, "not_found")
	c.cancelBrowser()
	s.stop(server)
}

// tokenVersion is the version of name's stored token, read with the
// stack's key of every right.
func (s *stack) tokenVersion(name string) int64 {
	s.t.Helper()
	code, body := s.do(http.MethodGet, "/connections/"+name+"/token", "")
	var tok struct {
		Version int64 `json:"version"`
	}
	if code != http.StatusOK || json.Unmarshal([]byte(body), &tok) != nil || tok.Version == 0 {
		s.t.Fatalf("GET the token of %s: %d %s", name, code, body)
	}
	return tok.Version
}

// loginAs logs key in through the console's login form.
func (c *console) loginAs(who, key string) {
	c.t.Helper()
	c.browse("log in as "+who, chromedp.Navigate(c.base+"/console"), chromedp.WaitVisible(css(`#key`)),
		chromedp.SendKeys(css(`#key`), key), chromedp.Submit(css(`#key`)), chromedp.WaitVisible(css(`table.grid`)))
}
