package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokenguard/tokenguard/internal/waitfor"
)

// errorHeader calls the server at path and returns the status and the
// Tokenguard-Error header.
func errorHeader(t *testing.T, s *stack, path string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+s.addr+path, nil)
	req.Header.Set("Authorization", "Bearer "+s.key)
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("Tokenguard-Error")
}

// connectionStatus is the connection's status in GET /connections.
func connectionStatus(t *testing.T, s *stack) string {
	code, body := s.do(http.MethodGet, "/connections", "")
	var page struct {
		Connections []struct {
			Status string `json:"status"`
		} `json:"connections"`
	}
	if code != http.StatusOK || json.Unmarshal([]byte(body), &page) != nil || len(page.Connections) != 1 {
		t.Fatalf("GET /connections: %d %s", code, body)
	}
	return page.Connections[0].Status
}

// outboxTypes are the types of the webhook events written, in order.
func outboxTypes(t *testing.T, dbURL string) []string {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(context.Background(), "SELECT type FROM tokenguard_webhook_outbox ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	types, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return types
}

// evidenceKept reports whether the apps kept both the check's answer and
// a success of the client.
func evidenceKept(t *testing.T, dbURL string) bool {
	conn, err := pgx.Connect(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	err = conn.QueryRow(context.Background(), `SELECT count(*) FROM tokenguard_refusal_evidence
		WHERE check_status IS NOT NULL AND worked_at IS NOT NULL`).Scan(&n)
	return err == nil && n > 0
}

// testDexRevokedGrant: the sandbox answers as Dex does (a dead refresh
// token 400 invalid_request). Each app's start-up check sends one request
// and logs one INFO line, no ERROR; with server, worker and batch using
// the connection, the grant revoked at the provider is needs_reauth after
// at most 3 refused requests, callers get 409 needs_reauth (JSON code and
// Tokenguard-Error), never client_rejected, and one
// connection.needs_reauth webhook is delivered; the webhook, GET
// /connections and the console give the evidence as the reason.
func testDexRevokedGrant(t *testing.T, bin string) {
	hookURL, bodies := webhookBodies(t)
	delivered := func(kind string) int { return len(bodies(kind)) }
	s := newStack(t, bin, stackOpts{lifetime: lifetime, skew: skew, dex: true,
		extraEnv: []string{"WEBHOOK_URL=" + hookURL, "WEBHOOK_SECRET=whsec_e2e_0123456789abcdef"}})
	s.migrate()
	const conn = "acme"
	s.importGrant(conn)
	server := s.start("server")
	s.waitHealthy(server)
	worker := s.start("worker")
	batchApp := s.start("batch", "--every", "300ms")
	apps := []*app{server, worker, batchApp}
	load := startStatusLoad(s, conn, 3)
	waitfor.Until(t, 30*time.Second, "each app's check and a refresh kept as evidence", func() bool {
		n, _ := appLines("token endpoint check:", apps...)
		return n == 3 && evidenceKept(t, s.dbURL)
	})
	st0 := s.sb.Stats()
	if st0.RefreshRejected != 3 {
		t.Errorf("%d refused requests before the revocation, want 3 (one check per app)", st0.RefreshRejected)
	}
	if n, lines := appLines("level=ERROR", apps...); n != 0 {
		t.Errorf("%d ERROR lines at start-up:\n%s", n, strings.Join(lines, "\n"))
	}
	if n, lines := appLines("learned as its answer to a dead grant", apps...); n != 3 {
		t.Errorf("%d check lines with the learned answer, want 3:\n%s", n, strings.Join(lines, "\n"))
	}
	load.reset()

	s.sb.RevokeAll()
	waitfor.Until(t, 30*time.Second, "the connection needs_reauth", func() bool { return connectionStatus(t, s) == "needs_reauth" })
	if n := s.sb.Stats().RefreshRejected - st0.RefreshRejected; n > 3 {
		t.Errorf("%d refused refresh requests before needs_reauth, want at most 3", n)
	} else {
		t.Logf("needs_reauth after %d refused refresh request(s), fleet-wide", n)
	}
	waitfor.Until(t, 2*lifetime+5*time.Second, "callers told 409 needs_reauth", func() bool {
		code, body := s.do(http.MethodGet, "/connections/"+conn+"/resource", "")
		return code == http.StatusConflict && strings.Contains(body, `"needs_reauth"`)
	})
	expectJSONError(t, s, http.MethodGet, "/connections/"+conn+"/resource", http.StatusConflict, "needs_reauth")
	waitfor.Until(t, 20*time.Second, "the needs_reauth webhook", func() bool { return delivered("connection.needs_reauth") > 0 })
	counts := load.finish()
	for k := range counts {
		if k != "200" && k != "409 needs_reauth" {
			t.Errorf("after the revocation the server answered %q %d times; want only 200 or 409 needs_reauth", k, counts[k])
		}
	}
	if n := delivered("connection.needs_reauth"); n != 1 {
		t.Errorf("%d connection.needs_reauth webhooks, want 1", n)
	}
	// Every surface names what the evidence says.
	const because = "invalid_request (HTTP 400, the provider's answer to a refresh token that cannot exist)"
	if code, header := errorHeader(t, s, "/connections/"+conn+"/resource"); code != http.StatusConflict || header != "needs_reauth" {
		t.Errorf("resource: %d Tokenguard-Error %q, want 409 needs_reauth", code, header)
	}
	var hook struct {
		Data struct{ Status, Reason string } `json:"data"`
	}
	if b := bodies("connection.needs_reauth"); len(b) == 0 || json.Unmarshal([]byte(b[0]), &hook) != nil ||
		hook.Data.Status != "needs_reauth" || hook.Data.Reason != because {
		t.Errorf("webhook %q: want status needs_reauth, reason %q", b, because)
	}
	if _, body := s.do(http.MethodGet, "/connections", ""); !strings.Contains(body, `"reason":"`+because+`"`) {
		t.Errorf("GET /connections: %s, want the reason %q", body, because)
	}
	page := consoleBody(t, consoleLogin(t, s, s.key), s, http.MethodGet, "/console/connections/"+conn, nil, http.StatusOK)
	if !strings.Contains(page, ">needs_reauth<") || !strings.Contains(page, "a refresh token that cannot exist") || strings.Contains(page, "client_rejected") {
		t.Errorf("the console's connection page does not say needs_reauth with the evidence")
	}
	for _, a := range []*app{batchApp, worker, server} {
		s.stop(a)
	}
}

// testDexWrongSecret, the control: at the same Dex-shaped provider, a
// server whose client secret is wrong are told client_rejected (the provider
// refuses the client with 401 invalid_client), the connection stays
// active and its grant untouched: with the right secret it refreshes.
func testDexWrongSecret(t *testing.T, bin string) {
	s := newStack(t, bin, stackOpts{lifetime: lifetime, skew: skew, dex: true, secret: "wrong-secret"})
	s.migrate()
	const conn = "acme"
	s.importGrant(conn)
	server := s.start("server")
	s.waitHealthy(server)
	load := startStatusLoad(s, conn, 2)
	waitfor.Until(t, 3*lifetime+10*time.Second, "callers told client_rejected", func() bool {
		counts := load.reset()
		return counts["503 client_rejected"] > 0
	})
	load.finish()
	if code, header := errorHeader(t, s, "/connections/"+conn+"/resource"); code != http.StatusServiceUnavailable || header != "client_rejected" {
		t.Errorf("resource: %d Tokenguard-Error %q, want 503 client_rejected", code, header)
	}
	if st := connectionStatus(t, s); st != "active" {
		t.Errorf("connection %s with a wrong client secret, want active", st)
	}
	if st := s.sb.Stats(); st.Refreshes != 0 || st.RefreshReuse != 0 {
		t.Errorf("provider stats %+v: want no refresh and no reuse", st)
	}
	// No event says the grant is dead or failing: the webhooks written
	// (the worker would deliver them) are the import's alone.
	if types := outboxTypes(t, s.dbURL); strings.Join(types, ",") != "connection.connected" {
		t.Errorf("webhook events %v, want connection.connected alone", types)
	}
	s.stop(server)

	// The grant is untouched: the right secret refreshes it.
	for i, kv := range s.env {
		if strings.HasPrefix(kv, "OAUTH_CLIENT_SECRET=") {
			s.env[i] = "OAUTH_CLIENT_SECRET=" + s.sb.OAuth2Config(s.sb.URL).ClientSecret
		}
	}
	server = s.start("server")
	s.waitHealthy(server)
	if code, body := s.do(http.MethodGet, "/connections/"+conn+"/resource", ""); code != http.StatusOK {
		t.Errorf("with the right secret: %d %s, want 200", code, body)
	}
	s.stop(server)
}
