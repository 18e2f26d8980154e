package e2e

import (
	"context"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokenguard/tokenguard/internal/waitfor"
)

// testReactivateAndCheck is the way back for grants marked dead for a
// client error, and tokenctl check, with a running server: the server
// serves a reactivated connection again (its next refresh decides), and
// check tells a good configuration from bad ones without spending a
// refresh token.
func testReactivateAndCheck(t *testing.T, bin string) {
	s := newStack(t, bin, stackOpts{lifetime: lifetime, skew: skew})
	s.migrate()
	for _, name := range []string{"acme", "beta", "gamma"} {
		s.importGrant(name)
	}
	// What a release that took invalid_client for a dead grant left
	// behind, and one grant that really is dead.
	conn, err := pgx.Connect(context.Background(), s.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), `UPDATE tokenguard_tokens t SET status = 'needs_reauth', version = version + 1,
		status_reason = CASE c.name WHEN 'gamma' THEN 'invalid_grant' ELSE 'invalid_client' END
		FROM tokenguard_connections c WHERE c.id = t.connection_id`); err != nil {
		t.Fatal(err)
	}
	type stored struct{ access, refresh, status string }
	read := func(name string) (st stored) {
		t.Helper()
		if err := conn.QueryRow(context.Background(), `SELECT t.access_token, t.refresh_token, t.status FROM tokenguard_tokens t
			JOIN tokenguard_connections c ON c.id = t.connection_id WHERE c.name = $1`, name).Scan(&st.access, &st.refresh, &st.status); err != nil {
			t.Fatal(err)
		}
		return st
	}
	gamma := read("gamma")

	// The server starts with a misspelt setting in its environment.
	env := s.env
	s.env = append(slices.Clone(env), "TOKEN_REFRESH_SKWE=2s")
	server := s.start("server")
	s.env = env
	s.waitHealthy(server)
	waitChecked(t, server)
	if out := server.Stderr(); !strings.Contains(out, `"msg":"TOKEN_REFRESH_SKWE is not a tokenguard setting and is ignored; did you mean TOKEN_REFRESH_SKEW?"`) ||
		!strings.Contains(out, `"msg":"token endpoint check: ok: `) {
		t.Errorf("server start-up lines:\n%s", tail(out, 3000))
	}
	expectJSONError(t, s, http.MethodGet, "/connections/acme/resource", http.StatusConflict, "needs_reauth")

	acme := read("acme")
	r := run(t, bin, "tokenctl", s.env, "", "reactivate", "--connection", "acme")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "reactivated connection acme: was needs_reauth (invalid_client), now active at version 3") {
		t.Fatalf("reactivate acme: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if got := read("acme"); got != (stored{acme.access, acme.refresh, "active"}) {
		t.Errorf("acme's tokens changed")
	}
	// The grant was alive: the server uses it again, refreshing it when due.
	for range 2 {
		if code, body := s.do(http.MethodGet, "/connections/acme/resource", ""); code != http.StatusOK {
			t.Errorf("acme after reactivate: %d %s", code, body)
		}
		time.Sleep(lifetime - skew)
	}

	r = run(t, bin, "tokenctl", s.env, "", "reactivate", "--all-with-reason", "invalid_client")
	if r.code != 0 || r.stdout != "reactivated connection beta: was needs_reauth (invalid_client), now active at version 3; the next refresh decides\n"+
		"reactivated 1 connection(s) marked needs_reauth for invalid_client\n" {
		t.Errorf("reactivate --all-with-reason: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if code, body := s.do(http.MethodGet, "/connections/beta/resource", ""); code != http.StatusOK {
		t.Errorf("beta after reactivate: %d %s", code, body)
	}
	expectJSONError(t, s, http.MethodGet, "/connections/gamma/resource", http.StatusConflict, "needs_reauth")
	if got := read("gamma"); got != gamma {
		t.Errorf("gamma changed: %+v, was %+v", got, gamma)
	}
	if r := run(t, bin, "tokenctl", s.env, "", "reactivate", "--connection", "nobody"); r.code != 2 ||
		r.stderr != "tokenctl: reactivate: connection \"nobody\" not found\n" {
		t.Errorf("reactivate nobody: exit %d %q", r.code, r.stderr)
	}

	// check: the stack's settings are right; a wrong secret and a closed
	// port are told apart. The provider refreshes nothing for it.
	before := s.sb.Stats()
	if r := run(t, bin, "tokenctl", s.env, "", "check"); r.code != 0 || !strings.HasPrefix(r.stdout, "ok: ") {
		t.Errorf("check: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := run(t, bin, "tokenctl", append(slices.Clone(s.env), "OAUTH_CLIENT_SECRET=wrong-secret"), "", "check"); r.code != 1 ||
		!strings.HasPrefix(r.stdout, "client rejected: ") || !strings.Contains(r.stdout, "to OAUTH_AUTH_STYLE=header and to params") ||
		strings.Contains(r.stdout+r.stderr, "wrong-secret") {
		t.Errorf("check with a wrong secret: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String() + "/token"
	ln.Close()
	if r := run(t, bin, "tokenctl", append(slices.Clone(s.env), "OAUTH_TOKEN_URL="+closed), "", "check"); r.code != 1 ||
		!strings.HasPrefix(r.stdout, "unreachable: ") || !strings.Contains(r.stdout, "connection refused") {
		t.Errorf("check of a closed port: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// One rejected request for the good client, two for the wrong secret
	// (OAUTH_AUTH_STYLE=auto tries both styles), none for the closed port.
	if after := s.sb.Stats(); after.Refreshes != before.Refreshes || after.RefreshRejected != before.RefreshRejected+3 {
		t.Errorf("provider during the checks: %+v -> %+v; want no refresh, 3 rejected", before, after)
	}
	s.stop(server)
	if st := s.sb.Stats(); st.RefreshReuse != 0 {
		t.Errorf("refresh-token reuse = %d", st.RefreshReuse)
	}
}

// waitChecked waits until each app has logged its start-up check of the
// token endpoint: that probe is a token request, which a test that holds
// or counts the provider's next request must not take for a refresh.
func waitChecked(t *testing.T, apps ...*app) {
	t.Helper()
	for _, a := range apps {
		waitfor.Until(t, 10*time.Second, a.Name+" logged no token endpoint check", func() bool {
			return strings.Contains(a.Stderr(), `"msg":"token endpoint check: `)
		})

	}
}
