package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"

	"github.com/tokenguard/tokenguard/internal/sandbox"
)

// TestConsoleRulesInBrowser drives the console in headless Chromium
// against the server binary and the sandbox, one build of the apps for
// its parts: the reasons of a connection's history and what a connection's
// state offers (Reasons), and the rule of a key's connection patterns
// (TenantPattern).
func TestConsoleRulesInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end")
	}
	chrome := chromium(t)
	bin := buildApps(t)
	t.Run("Reasons", func(t *testing.T) { testConsoleReasons(t, chrome, bin) })
	t.Run("TenantPattern", func(t *testing.T) { testConsoleTenantPattern(t, chrome, bin) })
}

// testConsoleReasons: every refresh in a connection's history says why it
// stored nothing. Against the server binary and the sandbox, one forced
// refresh per connection meets one fault: a token endpoint that hangs
// past the answer deadline (timeout), one that processes the refresh and
// drops the connection (answer lost), one that answers 503 (provider
// unavailable), one that answers a code nobody knows until the connection
// is failing (unclassified, with status and code), and one that answers
// invalid_grant (needs_reauth). The recorded history names each; a row as
// an earlier release wrote it (no reason) is shown as not recorded. Then
// headless Chromium, logged in to the console: the connections page shows
// the failing connection as failing and the dead one as needs_reauth;
// each connection's page shows its history row's reason; Reactivate is
// offered on the needs_reauth connection only; the reconnect form's
// return-to field is styled by the console's stylesheet. With
// CONSOLE_SCREENSHOTS=dir it saves the failing connection's page there.
func testConsoleReasons(t *testing.T, chrome, bin string) {
	var fault atomic.Int64
	s := newStack(t, bin, stackOpts{lifetime: time.Hour, skew: 30 * time.Second,
		fault: func() sandbox.Fault { return sandbox.Fault(fault.Load()) },
		// A 503's retries end well within a caller's wait (else the
		// provider's calls would pause, as for a hung one, and refuse the
		// next steps).
		extraEnv: []string{"TOKEN_LOCK_WAIT=8s", "TOKEN_REFRESH_TIMEOUT=5s", "TOKEN_ANSWER_DEADLINE=5s"}})
	s.migrate()
	names := []string{"acme", "dead-1", "lost-1", "odd-1", "old-1", "timeout-1", "unavailable-1"}
	for _, n := range names {
		s.importGrant(n)
	}
	server := s.start("server")
	s.waitHealthy(server)
	s.forceRefresh("acme") // a refresh that stored its token: "ok", no reason

	// Each fault met by one refresh; the hang last (it pauses the
	// provider's calls while its answer is awaited).
	meet := func(f sandbox.Fault, name string) {
		t.Helper()
		fault.Store(int64(f))
		code, body := s.refreshOnce(name)
		fault.Store(int64(sandbox.FaultNone))
		t.Logf("%s refreshed against %s: %d %.200s", name, f, code, body)
	}
	meet(sandbox.FaultLostAnswer, "lost-1")
	meet(sandbox.FaultUnavailable, "unavailable-1")
	meet(sandbox.FaultInvalidGrant, "dead-1")
	fault.Store(int64(sandbox.FaultUnknownCode))
	for deadline := time.Now().Add(90 * time.Second); s.status("odd-1") != "failing"; time.Sleep(time.Second) {
		if time.Now().After(deadline) {
			t.Fatalf("odd-1 is %s after 90 s of refusals, want failing", s.status("odd-1"))
		}
		s.refreshOnce("odd-1")
	}
	fault.Store(int64(sandbox.FaultNone))
	meet(sandbox.FaultHang, "timeout-1")
	oldRow(t, s.dbURL, "old-1")

	want := map[string]string{
		"timeout-1":     "timeout: no answer within 5s; the answer is lost",
		"lost-1":        "answer lost: the connection dropped after the request was sent",
		"unavailable-1": "not stored: provider unavailable (HTTP 503 temporarily_unavailable)",
		"odd-1":         "unclassified answer: HTTP 400 unrecognized_error", // as errors report an unknown code
		"dead-1":        "invalid_grant",
		"old-1":         "", // as an earlier release wrote it
	}
	for name, reason := range want {
		got := waitReason(t, s.dbURL, name, 10*time.Second)
		if !strings.HasPrefix(got, reason) || (reason == "") != (got == "") {
			t.Errorf("%s's last refresh recorded with reason %q, want %q", name, got, reason)
		}
	}
	if got := waitReason(t, s.dbURL, "acme", 0); got != "" {
		t.Errorf("acme's refresh that stored its token has reason %q", got)
	}

	c := openConsole(t, chrome, s)
	c.loginAs("the operator", s.key)
	rows := c.text(`table.grid tbody`)
	for name, status := range map[string]string{"odd-1": "failing", "dead-1": "needs_reauth", "acme": "active"} {
		if row := rowOf(rows, name); !strings.Contains(row, status) {
			t.Errorf("the connections page shows %s as %q, want %s", name, row, status)
		}
	}
	shown := map[string]string{"old-1": "not stored (reason not recorded)"}
	for name, reason := range want {
		if reason != "" {
			shown[name] = reason
		}
	}
	for name, reason := range shown {
		c.browse("open "+name, chromedp.Navigate(c.base+"/console/connections/"+name), chromedp.WaitVisible(css(`.facts`)))
		if history := c.text(`section.card.flush table tbody`); !strings.Contains(history, reason) {
			t.Errorf("%s's history in the console does not say %q:\n%s", name, reason, history)
		}
		reactivate := c.count(`form[action$="/reactivate"] button`)
		if want := name == "dead-1"; (reactivate == 1) != want {
			t.Errorf("%s's page offers Reactivate %d times (needs_reauth: %t)", name, reactivate, want)
		}
		if name == "odd-1" {
			if h1 := c.text(`h1`); !strings.Contains(h1, "failing") {
				t.Errorf("odd-1's heading: %q, want failing", h1)
			}
			if notice := c.text(`.notice.bad[role=status]`); !strings.Contains(notice, "Refreshes are failing") || !strings.Contains(notice, "unrecognized_error") {
				t.Errorf("odd-1's failing notice: %q", notice)
			}
			c.returnToStyled()
			c.shot("console-failing.png")
		}
	}
	c.cancelBrowser()
	s.stop(server)
	if st := s.sb.Stats(); st.RefreshReuse != 0 {
		t.Errorf("refresh-token reuse at the sandbox: %d", st.RefreshReuse)
	}
}

// refreshOnce asks the server once to refresh name's current token, as a
// caller whose API refused it would, waiting out the spacing of forced
// refreshes; any answer but 429 is returned.
func (s *stack) refreshOnce(name string) (int, string) {
	s.t.Helper()
	code, body := s.do(http.MethodGet, "/connections/"+name+"/token", "")
	var tok struct {
		Version int64 `json:"version"`
	}
	if code != http.StatusOK || json.Unmarshal([]byte(body), &tok) != nil || tok.Version == 0 {
		s.t.Fatalf("GET the token of %s: %d %s", name, code, body)
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		code, body = s.do(http.MethodPost, "/connections/"+name+"/token/refresh", `{"stale_version":`+strconv.FormatInt(tok.Version, 10)+`}`)
		if code != http.StatusTooManyRequests || time.Now().After(deadline) {
			return code, body
		}
	}
}

// status is name's status as GET /connections lists it.
func (s *stack) status(name string) string {
	s.t.Helper()
	code, body := s.do(http.MethodGet, "/connections", "")
	var page struct {
		Connections []struct {
			Name   string `json:"connection"`
			Status string `json:"status"`
		} `json:"connections"`
	}
	if code != http.StatusOK || json.Unmarshal([]byte(body), &page) != nil {
		s.t.Fatalf("GET /connections: %d %s", code, body)
	}
	for _, c := range page.Connections {
		if c.Name == name {
			return c.Status
		}
	}
	s.t.Fatalf("GET /connections lists no %s: %s", name, body)
	return ""
}

// oldRow records a refresh of connection as a release before reasons did:
// not_stored, without one.
func oldRow(t *testing.T, dbURL, connection string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `INSERT INTO tokenguard_connection_events (connection, kind, outcome, version, duration_ms)
VALUES ($1, 'refresh', 'not_stored', 1, 5)`, connection); err != nil {
		t.Fatal(err)
	}
}

// waitReason is the reason of connection's last recorded refresh, once
// there is one (within); "" for none.
func waitReason(t *testing.T, dbURL, connection string, within time.Duration) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for deadline := time.Now().Add(within); ; time.Sleep(200 * time.Millisecond) {
		var reason, outcome string
		err := conn.QueryRow(ctx, `SELECT reason, outcome FROM tokenguard_connection_events
WHERE connection = $1 AND kind = 'refresh' ORDER BY id DESC LIMIT 1`, connection).Scan(&reason, &outcome)
		if err == nil || time.Now().After(deadline) {
			if err != nil && err != pgx.ErrNoRows {
				t.Fatal(err)
			}
			return reason
		}
	}
}

// rowOf is the line of a table's text that names name.
func rowOf(rows, name string) string {
	for _, line := range strings.Split(rows, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), name) {
			return line
		}
	}
	return ""
}

// count is how many elements match sel on the page.
func (c *console) count(sel string) int {
	c.t.Helper()
	n, err := chromedp.Run(c.bctx, chromedp.Evaluate[int](`document.querySelectorAll(`+strconv.Quote(sel)+`).length`))
	if err != nil {
		c.t.Fatalf("count %s: %v", sel, err)
	}
	return n
}

// returnToStyled checks that the reconnect form's return-to field is drawn
// by the console's stylesheet (its border, radius and width), not the
// browser's defaults.
func (c *console) returnToStyled() {
	c.t.Helper()
	type style struct {
		Radius, Border, Width string
	}
	st, err := chromedp.Run(c.bctx, chromedp.Evaluate[style](`(() => {
  const s = getComputedStyle(document.querySelector('form[action$="/reconnect"] input[name=return_to]'));
  return {Radius: s.borderTopLeftRadius, Border: s.borderTopColor, Width: s.minWidth};
})()`))
	if err != nil {
		c.t.Fatalf("style of the return-to field: %v", err)
	}
	if st.Radius != "7px" || st.Border != "rgb(207, 212, 220)" || st.Width != "280px" {
		c.t.Errorf("the return-to field is not styled by the console's stylesheet: %+v", st)
	}
}
