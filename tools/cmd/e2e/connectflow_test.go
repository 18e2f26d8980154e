package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/internal/sandbox"
)

// testHijackedLink is the attack of a multi-tenant app's user M on a
// victim V: M asks the app for a connect link for his own connection and
// gets V, signed in at the provider, to open it in her browser and
// consent. Nothing may be stored until the app's backend redeems the
// result, which it does not (the browser that came back is not M's); M
// cannot redeem it without the app's API key; the result expires and V's
// grant is revoked at the provider; an expired or replayed result is
// refused and stores nothing. With control the server is the build that
// stores at the callback: the check must then find the hijack.
func testHijackedLink(t *testing.T, bin string, control bool) {
	s := newStack(t, bin, stackOpts{lifetime: lifetime, skew: skew})
	s.env = append(s.env, "OAUTH_USERINFO_URL="+s.sb.URL+"/userinfo", "OAUTH_REVOCATION_URL="+sandbox.RevocationURL(s.sb.URL))
	if control {
		s.serverBin = controlServer(t)
	}
	s.migrate()
	server := s.start("server")
	s.waitHealthy(server)
	defer s.stop(server)

	found := hijack(t, s)
	if control {
		if len(found) == 0 {
			t.Fatal("control: the attack found nothing wrong with a server that stores at the callback; the check cannot fail")
		}
		t.Logf("control (the server stores at the callback): the check finds %q", found)
		return
	}
	for _, f := range found {
		t.Error(f)
	}
}

// hijack runs the attack and says what went wrong.
func hijack(t *testing.T, s *stack) []string {
	var found []string
	const conn = "tenant-m.mallory"
	link := s.connectSession(conn, "") // M's link, from the app's backend
	victim := personAt(s, "victim", "")
	resp, body := press(t, victim, link)
	if !strings.Contains(body, conn) && resp.StatusCode == http.StatusOK {
		found = append(found, "the consent page does not name the connection")
	}
	back := returned(resp)
	if back == nil {
		return append(found, fmt.Sprintf("the victim's browser did not come back to return_to: %s %q", resp.Status, resp.Header.Get("Location")))
	}
	// The grant is the victim's, and nothing is stored for M's connection.
	if n := count(t, s.dbURL, `SELECT count(*) FROM tokenguard_tokens t JOIN tokenguard_connections c ON c.id = t.connection_id WHERE c.name = $1`, conn); n != 0 {
		found = append(found, "the victim's consent stored a grant for the attacker's connection before any redemption")
	}
	if code, body := s.do(http.MethodGet, "/connections/"+conn+"/resource", ""); code == http.StatusOK {
		found = append(found, "the attacker reads the victim's data through his connection: "+body)
	}
	result := back.Query().Get("result")
	if back.Query().Get("status") != "pending" || !strings.HasPrefix(result, "tgr_") {
		return append(found, fmt.Sprintf("return_to got no pending result: %q", back.String()))
	}
	// M has the result (he may own the return_to's page); without the
	// app's key he cannot redeem it.
	for _, key := range []string{"", "tgk_" + strings.Repeat("A", 43)} {
		if code, _, raw := s.redeem(key, result); code != http.StatusUnauthorized {
			found = append(found, fmt.Sprintf("redeem with key %.8q: %d %s, want 401", key, code, raw))
		}
	}
	// The app does not redeem it: it expires, and the sweep revokes the
	// victim's grant at the provider and deletes it.
	var refresh string
	if err := queryRow(t, s.dbURL, `SELECT refresh_token FROM tokenguard_connect_results WHERE connection = $1`, conn).Scan(&refresh); err != nil {
		return append(found, "no pending result kept: "+err.Error())
	}
	revocations := s.sb.Stats().Revocations
	sql(t, s.dbURL, `UPDATE tokenguard_connect_results SET expires_at = now() - interval '1 second' WHERE connection = $1`, conn)
	deadline := time.Now().Add(30 * time.Second)
	for count(t, s.dbURL, `SELECT count(*) FROM tokenguard_connect_results WHERE connection = $1`, conn) != 0 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	if n := count(t, s.dbURL, `SELECT count(*) FROM tokenguard_connect_results WHERE connection = $1`, conn); n != 0 {
		found = append(found, "the expired result was not swept within 30s")
	}
	if s.sb.Stats().Revocations <= revocations {
		found = append(found, "the expired result's grant was not revoked at the provider")
	}
	if _, err := s.sb.OAuth2Config(s.sb.URL).TokenSource(context.Background(), &oauth2.Token{RefreshToken: refresh}).Token(); err == nil {
		found = append(found, "the victim's grant still refreshes at the provider after the sweep")
	}
	// Redeemed late, the result is refused and stores nothing.
	if code, r, raw := s.redeem(s.key, result); code != http.StatusGone || r.Code != "result_invalid" {
		found = append(found, fmt.Sprintf("redeem after the expiry: %d %s, want 410 result_invalid", code, raw))
	}
	if n := count(t, s.dbURL, `SELECT count(*) FROM tokenguard_tokens t JOIN tokenguard_connections c ON c.id = t.connection_id WHERE c.name = $1`, conn); n != 0 {
		found = append(found, "the attacker's connection holds a grant at the end")
	}
	// M's own consent, redeemed by the backend, connects; a replay of its
	// result is refused and changes nothing.
	resp, _ = press(t, personAt(s, "mallory", ""), s.connectSession(conn, ""))
	back = returned(resp)
	if back == nil || back.Query().Get("status") != "pending" {
		return append(found, fmt.Sprintf("M's own consent: %s %q", resp.Status, resp.Header.Get("Location")))
	}
	if code, r, raw := s.redeem(s.key, back.Query().Get("result")); code != http.StatusOK || r.Account != "mallory" {
		found = append(found, fmt.Sprintf("redeem M's own result: %d %s", code, raw))
	}
	before := storedRow(t, s.dbURL, conn)
	if code, _, raw := s.redeem(s.key, back.Query().Get("result")); code != http.StatusGone {
		found = append(found, fmt.Sprintf("replayed result: %d %s, want 410", code, raw))
	}
	if after := storedRow(t, s.dbURL, conn); after != before {
		found = append(found, "a replayed result changed the stored grant")
	}
	return found
}

// testConsentPageCSRF: the consent page's button only works with the
// CSRF token of the browser's own flow cookie; a page elsewhere that posts
// the form for a victim (with a session it got) starts nothing, and the
// provider is asked with prompt=consent.
func testConsentPageCSRF(t *testing.T, bin string) {
	s := newStack(t, bin, stackOpts{lifetime: lifetime, skew: skew})
	s.migrate()
	server := s.start("server")
	s.waitHealthy(server)
	defer s.stop(server)
	link := s.connectSession("acme", "")
	u, _ := url.Parse(link)
	session := u.Query().Get("session")
	// The attacker has the link and posts its form from another site: the
	// victim's browser has no flow cookie of that page, or another one.
	victim := personAt(s, "victim", "")
	if resp, _ := get(t, victim, "http://"+s.addr+"/healthz"); resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz: %s", resp.Status)
	}
	for name, form := range map[string]url.Values{
		"no token":     {"session": {session}},
		"forged token": {"session": {session}, "csrf": {strings.Repeat("A", 43)}},
	} {
		req, _ := http.NewRequest(http.MethodPost, "http://"+s.addr+"/oauth/connect", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if resp, _ := do(t, victim, req); resp.StatusCode != http.StatusForbidden {
			t.Errorf("cross-site POST (%s): %s, want 403", name, resp.Status)
		}
	}
	// The session is still unspent: the person who asked can use it.
	prompts := s.sb.Stats().ConsentPrompts
	s.connectVia("acme", "", "", "") // a new session; the old one below
	if resp, body := press(t, personAt(s, "", ""), link); returned(resp) == nil {
		t.Errorf("the link after the forged POSTs: %s %.200s", resp.Status, body)
	}
	if n := s.sb.Stats().ConsentPrompts - prompts; n != 2 {
		t.Errorf("authorization requests with prompt=consent: %d, want 2", n)
	}
}

// queryRow runs one query on a connection of its own.
func queryRow(t *testing.T, dbURL, q string, args ...any) rowScanner {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	return rowScanner{conn.QueryRow(ctx, q, args...), conn}
}

type rowScanner struct {
	row  pgx.Row
	conn *pgx.Conn
}

func (r rowScanner) Scan(dest ...any) error {
	defer r.conn.Close(context.Background())
	return r.row.Scan(dest...)
}
