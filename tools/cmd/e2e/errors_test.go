package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// testErrors checks the exit codes and messages of bad configuration and
// bad input, and the HTTP answers for unknown and revoked connections.
func testErrors(t *testing.T, bin string) {
	s := newStack(t, bin, stackOpts{lifetime: lifetime, skew: skew})
	without := func(keys ...string) []string {
		var out []string
	next:
		for _, e := range s.env {
			for _, k := range keys {
				if strings.HasPrefix(e, k+"=") {
					continue next
				}
			}
			out = append(out, e)
		}
		return out
	}
	with := func(kv ...string) []string { return append(without(), kv...) }

	for _, c := range []struct {
		name, bin string
		env       []string
		args      []string
		stdin     string
		code      int
		stderr    string
	}{
		{"server without DATABASE_URL", "server", without("DATABASE_URL"), nil, "", 2, "server: DATABASE_URL is required\n"},
		{"worker with a bad skew", "worker", with("TOKEN_REFRESH_SKEW=soon"), nil, "", 2,
			"worker: TOKEN_REFRESH_SKEW is malformed: unable to parse duration: time: invalid duration \"soon\"\n"},
		{"batch with a bad database URL", "batch", with("DATABASE_URL=postgres://x:y@host:notaport/db"), nil, "", 2,
			"batch: DATABASE_URL is malformed: invalid port\n"},
		{"batch without API_BASE_URL", "batch", without("API_BASE_URL"), nil, "", 2, "batch: API_BASE_URL is required\n"},
		{"server without OAUTH_TOKEN_URL", "server", without("OAUTH_TOKEN_URL"), nil, "", 2, "server: OAUTH_TOKEN_URL is required\n"},
		{"server with a relative API_BASE_URL", "server", with("API_BASE_URL=/api"), nil, "", 2,
			"server: API_BASE_URL must be an http(s) URL, got \"/api\"\n"},
		{"batch with a bad --every", "batch", s.env, []string{"--every", "often"}, "", 2, ""},
		{"tokenctl without DATABASE_URL", "tokenctl", without("DATABASE_URL"), []string{"status"}, "", 2, "tokenctl: DATABASE_URL is required\n"},
		{"tokenctl unknown command", "tokenctl", s.env, []string{"frobnicate"}, "", 2, ""},
		{"import without --connection", "tokenctl", s.env, []string{"import"}, "{}", 2, "tokenctl: import: --connection NAME is required\n"},
		{"import of bad JSON", "tokenctl", s.env, []string{"import", "--connection", "acme"}, `{"access_token": "a",`, 2,
			"tokenctl: import: stdin is not a token in golang.org/x/oauth2's JSON shape: truncated JSON\n"},
		{"import of a non-token", "tokenctl", s.env, []string{"import", "--connection", "acme"}, `["a"]`, 2,
			"tokenctl: import: stdin is not a token in golang.org/x/oauth2's JSON shape: field \"\" must be a oauth2.Token\n"},
		{"import without a refresh token", "tokenctl", s.env, []string{"import", "--connection", "acme"},
			`{"access_token":"at-secret-1","token_type":"Bearer","expiry":"2030-01-01T00:00:00Z"}`, 2,
			"tokenctl: import: invalid token: refresh_token is empty; without it the connection could never be refreshed\n"},
		{"import under a bad name", "tokenctl", s.env, []string{"import", "--connection", "no/slash"}, "{}", 2,
			"tokenctl: invalid connection name: \"no/slash\" (want 1-128 of A-Z a-z 0-9 . _ -, starting with a letter or digit)\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := run(t, bin, c.bin, c.env, c.stdin, c.args...)
			if r.code != c.code {
				t.Errorf("exit %d, want %d; stderr %q", r.code, c.code, r.stderr)
			}
			if c.stderr != "" && r.stderr != c.stderr {
				t.Errorf("stderr = %q, want %q", r.stderr, c.stderr)
			}
			if c.stderr == "" && (r.stderr == "" || strings.Contains(r.stderr, "goroutine ")) {
				t.Errorf("stderr = %q, want a message and no stack trace", r.stderr)
			}
			if strings.Contains(r.stdout+r.stderr, "at-secret-1") {
				t.Errorf("a secret was printed: %q", r.stdout+r.stderr)
			}
		})
	}
	// On a database without the schema, tokenctl fails (2) and says what to run.
	if r := run(t, bin, "tokenctl", s.env, "", "status"); r.code != 2 ||
		r.stderr != "tokenctl: the database has no tokenguard tables yet: run `tokenctl migrate` first\n" {
		t.Errorf("status before migrate: exit %d, stderr %q", r.code, r.stderr)
	}
	s.migrate()
	if r := run(t, bin, "tokenctl", s.env, "", "status", "--connection", "nobody"); r.code != 2 ||
		r.stderr != "tokenctl: status: connection \"nobody\" not found\n" {
		t.Errorf("status of an unknown connection: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := run(t, bin, "tokenctl", s.env, "", "status"); r.code != 0 || r.stdout != "no connections\n" {
		t.Errorf("status of no connections: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}

	// HTTP errors: unknown connection 404, bad name 400, revoked grant 409.
	s.importGrant("acme")
	server := s.start("server")
	s.waitHealthy(server)
	expectJSONError(t, s, http.MethodGet, "/connections/nobody/resource", http.StatusNotFound, "not_found")
	expectJSONError(t, s, http.MethodPost, "/connections/nobody/events", http.StatusNotFound, "not_found")
	expectJSONError(t, s, http.MethodGet, "/connections/-bad/resource", http.StatusBadRequest, "invalid_connection")
	expectJSONError(t, s, http.MethodPost, "/connections/acme/events", http.StatusBadRequest, "bad_request", "{not json")
	if code, body := s.do(http.MethodGet, "/connections/acme/resource", ""); code != http.StatusOK {
		t.Fatalf("acme before revocation: %d %s", code, body)
	}
	// The provider revokes the grant; at the next refresh the connection is
	// marked as needing re-authorisation and every app is told so.
	s.sb.RevokeAll()
	time.Sleep(lifetime - skew)
	expectJSONError(t, s, http.MethodGet, "/connections/acme/resource", http.StatusConflict, "needs_reauth")
	expectJSONError(t, s, http.MethodPost, "/connections/acme/events", http.StatusConflict, "needs_reauth")
	if r := run(t, bin, "batch", s.env, ""); r.code != 0 || !strings.Contains(r.stdout, `"skipped":1`) {
		t.Errorf("batch with only a connection needing re-authorisation: exit %d, stdout %q", r.code, r.stdout)
	}
	if r := run(t, bin, "tokenctl", s.env, "", "status"); r.code != 0 || !strings.Contains(r.stdout, "needs_reauth") ||
		!strings.Contains(r.stdout, "invalid_grant") {
		t.Errorf("status after revocation: exit %d\n%s", r.code, r.stdout)
	}
	// Connecting again through the browser flow makes it usable again.
	connectViaBrowser(t, s, "acme")
	if code, body := s.do(http.MethodGet, "/connections/acme/resource", ""); code != http.StatusOK {
		t.Errorf("acme after reconnecting: %d %s", code, body)
	}
	s.stop(server)
	if st := s.sb.Stats(); st.RefreshReuse != 0 {
		t.Errorf("refresh-token reuse = %d", st.RefreshReuse)
	}
}

func expectJSONError(t *testing.T, s *stack, method, path string, status int, code string, body ...string) {
	t.Helper()
	got, resp := s.do(method, path, strings.Join(body, ""))
	var e struct {
		Error string `json:"error"`
		Code  string `json:"code"`
	}
	if got != status || json.Unmarshal([]byte(resp), &e) != nil || e.Code != code || e.Error == "" {
		t.Errorf("%s %s = %d %s, want %d with a JSON error %q", method, path, got, resp, status, code)
	}
}

// connectViaBrowser gets a connect session, follows its URL through the
// consent page, the provider and back to /oauth/callback as a browser
// would, and has the backend redeem the result.
func connectViaBrowser(t *testing.T, s *stack, name string) {
	t.Helper()
	c := personAt(s, "", "")
	connectURL := s.connectSession(name, "")
	resp, body := press(t, c, connectURL)
	back := returned(resp)
	if back == nil || back.Query().Get("status") != "pending" {
		t.Fatalf("connect flow: %s Location %q %s", resp.Status, resp.Header.Get("Location"), body)
	}
	// The callback is single-use: replaying it fails on the flow check.
	if resp2, _ := get(t, c, resp.Request.URL.String()); resp2.StatusCode != http.StatusBadRequest {
		t.Errorf("replayed callback answered %s", resp2.Status)
	}
	// So is the session.
	if resp3, _ := get(t, c, connectURL); resp3.StatusCode != http.StatusUnauthorized {
		t.Errorf("replayed connect session answered %s", resp3.Status)
	}
	if code, _, raw := s.redeem(s.key, back.Query().Get("result")); code != http.StatusOK {
		t.Fatalf("redeem: %d %s", code, raw)
	}
}
