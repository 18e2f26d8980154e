package e2e

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokenguard/tokenguard/internal/sandbox"
)

// forbidden is a 403's body.
type forbidden struct {
	Error        string   `json:"error"`
	Code         string   `json:"code"`
	MissingScope string   `json:"missing_scope"`
	Connection   string   `json:"connection"`
	Allowed      []string `json:"allowed_connections"`
}

// expectForbidden checks a 403 that names what the key lacks: code, and
// the missing scope or the connection.
func expectForbidden(t *testing.T, s *stack, key, method, path, body, code, scope string) {
	t.Helper()
	got, resp := s.doWith(key, method, path, body)
	var f forbidden
	if got != http.StatusForbidden || json.Unmarshal([]byte(resp), &f) != nil || f.Code != code || f.Error == "" ||
		f.MissingScope != scope || (code == "connection_not_allowed" && f.Connection == "") {
		t.Errorf("%s %s %s: %d %s, want 403 %s %s", method, path, body, got, resp, code, scope)
	}
}

func expectStatus(t *testing.T, s *stack, key, method, path, body string, want int) string {
	t.Helper()
	got, resp := s.doWith(key, method, path, body)
	if got != want {
		t.Errorf("%s %s %s: %d %s, want %d", method, path, body, got, resp, want)
	}
	return resp
}

// testKeysAndEdges is issue 23's attacker's view of API keys, URLs and
// stored ciphertexts, with real processes: each scope and pattern refused
// and allowed (a key of every right, as every key created before scopes
// is, is the control), http URLs refused at start-up and by tokenctl (the
// loopback or ALLOW_INSECURE_URLS control accepted), return_to variants a
// prefix check would let through refused, a stored provider without an
// API base URL refused instead of sending its token to API_BASE_URL, and
// a ciphertext copied back into its row refused with nothing served (the
// current one copied back is the control).
func testKeysAndEdges(t *testing.T, bin string) {
	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	s := newStack(t, bin, stackOpts{lifetime: lifetime, skew: skew, extraEnv: []string{
		"CONNECT_RETURN_URLS=http://app.example/settings/",
		"TOKEN_ENCRYPTION_KEYS=k1=" + base64.StdEncoding.EncodeToString(raw) + "*",
	}})
	s.migrate()
	s.importGrant("tenant-a-crm")
	s.importGrant("acme")
	server := s.start("server")
	s.waitHealthy(server)
	full := s.key // no --scopes, no --connections: every right, as a key made before scopes
	checkScopesAndPatterns(t, s, bin, full)
	checkReturnToAndMetadata(t, s, bin, full)
	checkNoAPIBaseURL(t, s, bin, full)
	checkInsecureURLs(t, s, bin)
	checkRolledBackCiphertext(t, s, full)
	s.stop(server)
}

// checkScopesAndPatterns: each key reaches the routes its scopes and
// connection patterns allow and no other; apikey list shows both.
func checkScopesAndPatterns(t *testing.T, s *stack, bin, full string) {
	var legacyShape bool
	if err := pgxQueryRow(t, s.dbURL, `SELECT scopes IS NULL AND connection_patterns IS NULL FROM tokenguard_api_keys WHERE name = 'e2e'`, &legacyShape); err != nil || !legacyShape {
		t.Fatalf("the key of every right is not stored as a key made before scopes: %v", err)
	}
	mk := func(name string, args ...string) string {
		t.Helper()
		r := run(t, bin, "tokenctl", s.env, "", append([]string{"apikey", "create", "--name", name}, args...)...)
		key := strings.TrimSpace(r.stdout)
		if r.code != 0 || !strings.HasPrefix(key, "tgk_") {
			t.Fatalf("apikey create %s %v: %d %s", name, args, r.code, r.stderr)
		}
		return key
	}
	tenant := mk("tenant", "--connections", "tenant-a-*", "--scopes", "token:read,api:call,connect")
	reader := mk("reader", "--scopes", "connections:read")
	tenantReader := mk("tenant-reader", "--scopes", "connections:read", "--connections", "tenant-a-*")
	// Control: the key of every right reaches every route below.
	for _, p := range []struct {
		method, path string
		want         int
	}{{"GET", "/connections/acme/token", 200}, {"GET", "/connections/tenant-a-crm/resource", 200},
		{"GET", "/connections", 200}, {"GET", "/metrics", 200}, {"POST", "/connections/acme/events", 202}} {
		expectStatus(t, s, full, p.method, p.path, "", p.want)
	}
	expectStatus(t, s, full, "POST", "/connect-sessions", `{"connection":"acme","allow_account_change":true,"return_to":"`+defaultReturnTo+`"}`, http.StatusCreated)
	// The tenant's key: its connections, its scopes, nothing else.
	expectStatus(t, s, tenant, "GET", "/connections/tenant-a-crm/token", "", http.StatusOK)
	expectStatus(t, s, tenant, "GET", "/connections/tenant-a-crm/resource", "", http.StatusOK)
	expectStatus(t, s, tenant, "GET", "/connections/tenant-a-crm/proxy/resource", "", http.StatusOK)
	expectStatus(t, s, tenant, "POST", "/connections/tenant-a-crm/events", "", http.StatusAccepted)
	expectStatus(t, s, tenant, "POST", "/connect-sessions", `{"connection":"tenant-a-crm","return_to":"`+defaultReturnTo+`"}`, http.StatusCreated)
	for _, p := range [][2]string{{"GET", "/connections/acme/token"}, {"POST", "/connections/acme/token/refresh"},
		{"GET", "/connections/acme/resource"}, {"GET", "/connections/acme/proxy/resource"}, {"POST", "/connections/acme/events"}} {
		expectForbidden(t, s, tenant, p[0], p[1], `{"stale_version":1}`, "connection_not_allowed", "")
	}
	expectForbidden(t, s, tenant, "POST", "/connect-sessions", `{"connection":"acme"}`, "connection_not_allowed", "")
	expectForbidden(t, s, tenant, "POST", "/connect-sessions", `{"connection":"tenant-a-crm","allow_account_change":true}`, "missing_scope", "admin")
	expectForbidden(t, s, tenant, "GET", "/metrics", "", "missing_scope", "admin")
	expectForbidden(t, s, tenant, "GET", "/connections", "", "missing_scope", "connections:read")
	// The reader lists and reads nothing else; a tenant's reader lists its own.
	var list struct {
		Connections []struct{ Connection string } `json:"connections"`
	}
	names := func(key string) []string {
		_ = json.Unmarshal([]byte(expectStatus(t, s, key, "GET", "/connections", "", http.StatusOK)), &list)
		var out []string
		for _, c := range list.Connections {
			out = append(out, c.Connection)
		}
		return out
	}
	if got := names(reader); !slices.Equal(got, []string{"acme", "tenant-a-crm"}) {
		t.Errorf("the reader lists %v", got)
	}
	if got := names(tenantReader); !slices.Equal(got, []string{"tenant-a-crm"}) {
		t.Errorf("the tenant's reader lists %v, want its own connection only", got)
	}
	expectForbidden(t, s, reader, "GET", "/connections/acme/token", "", "missing_scope", "token:read")
	expectForbidden(t, s, reader, "GET", "/connections/acme/resource", "", "missing_scope", "api:call")
	expectForbidden(t, s, reader, "POST", "/connect-sessions", `{"connection":"acme"}`, "missing_scope", "connect")
	r := run(t, bin, "tokenctl", s.env, "", "apikey", "list")
	want := map[string]string{"e2e": "all all", "tenant": "token:read,api:call,connect tenant-a-*", "reader": "connections:read all"}
	for l := range strings.SplitSeq(r.stdout, "\n") {
		if f := strings.Fields(l); len(f) >= 5 && want[f[0]] == f[len(f)-2]+" "+f[len(f)-1] {
			delete(want, f[0])
		}
	}
	if r.code != 0 || len(want) > 0 {
		t.Errorf("apikey list does not show %v:\n%s", want, r.stdout)
	}
}

// checkReturnToAndMetadata: return_to variants a prefix check lets
// through are refused; metadata with a NUL is a 400 from the API and a
// usage error from tokenctl, and nothing is stored.
func checkReturnToAndMetadata(t *testing.T, s *stack, bin, full string) {
	const allowed = "http://app.example/settings/"
	for _, rt := range []string{
		allowed + "../admin", allowed + "%2e%2e/admin", allowed + "%2E%2e/admin", allowed + ".%2e/admin", allowed + "%252e%252e/admin",
		allowed + "./x", allowed + "..%2fadmin", allowed + `..\\admin`, allowed + `\\evil.example`, allowed + "%5cevil.example",
		allowed + `x\u0009y`, allowed + `x\r\nSet-Cookie: a=b`, allowed + "x%00y",
	} {
		var decoded string
		_ = json.Unmarshal([]byte(`"`+rt+`"`), &decoded)
		if !strings.HasPrefix(decoded, allowed) {
			t.Fatalf("variant %q does not start with the allowed prefix: it proves nothing", rt)
		}
		b, _ := json.Marshal(map[string]string{"connection": "acme", "return_to": decoded})
		got, resp := s.doWith(full, "POST", "/connect-sessions", string(b))
		if got != http.StatusBadRequest || !strings.Contains(resp, "return_to_not_allowed") {
			t.Errorf("return_to %q: %d %s, want 400 return_to_not_allowed", decoded, got, resp)
		}
	}
	expectStatus(t, s, full, "POST", "/connect-sessions", `{"connection":"acme","return_to":"`+allowed+`done?next=x"}`, http.StatusCreated)

	// Metadata with a NUL: 400 invalid_metadata, not a store error, from
	// the API and from tokenctl; the same without the NUL is stored.
	expectJSONError(t, s, "POST", "/connect-sessions", http.StatusBadRequest, "invalid_metadata", `{"connection":"acme","metadata":{"tenant":"t\u0000x"}}`)
	expectStatus(t, s, full, "POST", "/connect-sessions", `{"connection":"acme","metadata":{"tenant":"t-x"},"return_to":"`+defaultReturnTo+`"}`, http.StatusCreated)
	g, err := sandboxGrant(s)
	if err != nil {
		t.Fatal(err)
	}
	if r := run(t, bin, "tokenctl", s.env, g, "import", "--connection", "acme", "--metadata", `{"a\u0000":1}`); r.code != 2 || !strings.Contains(r.stderr, "NUL") {
		t.Errorf("tokenctl import with a NUL in the metadata: %d %s", r.code, r.stderr)
	}
}

// checkNoAPIBaseURL: a stored provider without an API base URL never
// sees its token sent to API_BASE_URL (another provider's API).
func checkNoAPIBaseURL(t *testing.T, s *stack, bin, full string) {
	cfg := s.sb.OAuth2Config(s.sb.URL)
	if r := run(t, bin, "tokenctl", s.env, cfg.ClientSecret+"\n", "provider", "add", "--name", "nobase",
		"--token-url", cfg.Endpoint.TokenURL, "--client-id", cfg.ClientID); r.code != 0 {
		t.Fatalf("provider add nobase: %d %s", r.code, r.stderr)
	}
	tok, err := sandboxGrant(s)
	if err != nil {
		t.Fatal(err)
	}
	if r := run(t, bin, "tokenctl", s.env, tok, "import", "--connection", "nobase-conn", "--provider", "nobase"); r.code != 0 {
		t.Fatalf("import --provider nobase: %d %s", r.code, r.stderr)
	}
	before := s.sb.Stats()
	expectJSONError(t, s, "GET", "/connections/nobase-conn/resource", http.StatusConflict, "no_api_base_url")
	expectJSONError(t, s, "GET", "/connections/nobase-conn/proxy/resource", http.StatusConflict, "no_api_base_url")
	if after := s.sb.Stats(); after.ResourceOK+after.Resource401 != before.ResourceOK+before.Resource401 {
		t.Errorf("the API at API_BASE_URL got %d calls with the token of a connection of another provider",
			after.ResourceOK+after.Resource401-before.ResourceOK-before.Resource401)
	}
	expectStatus(t, s, full, "GET", "/connections/nobase-conn/token", "", http.StatusOK) // the token itself is there
}

// checkInsecureURLs: http URLs are refused naming the flag or variable;
// ALLOW_INSECURE_URLS=true (the control) accepts them.
func checkInsecureURLs(t *testing.T, s *stack, bin string) {
	for _, c := range []struct {
		flag string
		args []string
	}{
		{"--token-url", []string{"add", "--name", "plain", "--token-url", "http://idp.example/token", "--client-id", "c"}},
		{"--auth-url", []string{"add", "--name", "plain", "--token-url", "https://idp.example/token", "--auth-url", "http://idp.example/auth", "--client-id", "c"}},
		{"--revocation-url", []string{"add", "--name", "plain", "--token-url", "https://idp.example/token", "--revocation-url", "http://idp.example/revoke", "--client-id", "c"}},
		{"--api-base-url", []string{"add", "--name", "plain", "--token-url", "https://idp.example/token", "--api-base-url", "http://api.example", "--client-id", "c"}},
		{"--api-base-url", []string{"update", "--name", "nobase", "--api-base-url", "http://api.example"}},
	} {
		r := run(t, bin, "tokenctl", s.env, "s3cret\n", append([]string{"provider"}, c.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, c.flag+" must be https") || strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("provider %v: exit %d, stderr %q; want 2 and one line naming %s", c.args, r.code, r.stderr, c.flag)
		}
	}
	if r := run(t, bin, "tokenctl", append(slices.Clone(s.env), "ALLOW_INSECURE_URLS=true"), "s3cret\n", "provider", "add", "--name", "plain",
		"--token-url", "http://idp.example/token", "--client-id", "c"); r.code != 0 {
		t.Errorf("control: provider add with ALLOW_INSECURE_URLS=true: %d %s", r.code, r.stderr)
	}
	for _, v := range []string{"PUBLIC_URL=http://tokenguard.example", "WEBHOOK_URL=http://hooks.example/tg",
		"OAUTH_USERINFO_URL=http://idp.example/userinfo"} {
		env := append(slices.Clone(s.env), v, "WEBHOOK_SECRET=whsec-0123456789abcdef")
		if !strings.HasPrefix(v, "WEBHOOK_URL") {
			env = append(env, "WEBHOOK_URL=https://hooks.example/tg")
		}
		name, _, _ := strings.Cut(v, "=")
		if r := run(t, bin, "server", env, ""); r.code != 2 || !strings.Contains(r.stderr, name+" must be https") {
			t.Errorf("server with %s: exit %d, stderr %q; want 2 naming %s", v, r.code, tail(r.stderr, 300), name)
		}
	}
}

// checkRolledBackCiphertext: a ciphertext copied back into its row, with
// its sealed_version, or moved from another connection, is refused with
// nothing served and no refresh token sent. Control: the current
// ciphertext copied back serves.
func checkRolledBackCiphertext(t *testing.T, s *stack, full string) {
	const victim = "tenant-a-crm"
	old := ciphertexts(t, s.dbURL, victim)
	expectStatus(t, s, full, "POST", "/connections/"+victim+"/token/refresh", `{"stale_version":`+old.version+`}`, http.StatusOK)
	cur := ciphertexts(t, s.dbURL, victim)
	if cur.version == old.version || cur.refresh == old.refresh || !strings.HasPrefix(cur.refresh, "tg1:k1:b:") {
		t.Fatalf("after the refresh: %+v, before %+v", cur, old)
	}
	// Control: writing back what is stored changes nothing that matters.
	sql(t, s.dbURL, `UPDATE tokenguard_tokens SET access_token = $1, refresh_token = $2 WHERE connection_id = (SELECT id FROM tokenguard_connections WHERE name = $3)`,
		cur.access, cur.refresh, victim)
	time.Sleep(lifetime) // past the cached token's expiry: the next read opens the row
	expectStatus(t, s, full, "GET", "/connections/"+victim+"/token", "", http.StatusOK)
	// The rollback.
	now := ciphertexts(t, s.dbURL, victim)
	sql(t, s.dbURL, `UPDATE tokenguard_tokens SET access_token = $1, refresh_token = $2, sealed_version = $4::text::bigint WHERE connection_id = (SELECT id FROM tokenguard_connections WHERE name = $3)`,
		old.access, old.refresh, victim, old.sealed)
	refreshes := s.sb.Stats().Refreshes + s.sb.Stats().RefreshRejected
	time.Sleep(lifetime)
	got, resp := s.doWith(full, "GET", "/connections/"+victim+"/token", "")
	if got != http.StatusInternalServerError || !strings.Contains(resp, `"code":"undecryptable"`) || strings.Contains(resp, "access_token") {
		t.Errorf("a rolled-back ciphertext: %d %s, want 500 undecryptable and no token", got, resp)
	}
	expectJSONError(t, s, "GET", "/connections/"+victim+"/resource", http.StatusInternalServerError, "undecryptable")
	if n := s.sb.Stats().Refreshes + s.sb.Stats().RefreshRejected; n != refreshes {
		t.Errorf("the rolled-back refresh token reached the provider (%d refresh requests)", n-refreshes)
	}
	// Moved from another connection: refused too.
	other := ciphertexts(t, s.dbURL, "acme")
	sql(t, s.dbURL, `UPDATE tokenguard_tokens SET access_token = $1, refresh_token = $2 WHERE connection_id = (SELECT id FROM tokenguard_connections WHERE name = $3)`,
		other.access, other.refresh, victim)
	expectJSONError(t, s, "GET", "/connections/"+victim+"/token", http.StatusInternalServerError, "undecryptable")
	// Put back, it serves again.
	sql(t, s.dbURL, `UPDATE tokenguard_tokens SET access_token = $1, refresh_token = $2 WHERE connection_id = (SELECT id FROM tokenguard_connections WHERE name = $3)`,
		now.access, now.refresh, victim)
	expectStatus(t, s, full, "GET", "/connections/"+victim+"/token", "", http.StatusOK)
}

func pgxQueryRow(t *testing.T, dbURL, q string, dst ...any) error {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, q).Scan(dst...)
}

type stored struct {
	access, refresh, version string
	sealed                   *string // sealed_version
}

func ciphertexts(t *testing.T, dbURL, name string) stored {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var st stored
	if err := conn.QueryRow(ctx, `SELECT t.access_token, t.refresh_token, t.version::text, t.sealed_version::text FROM tokenguard_tokens t JOIN tokenguard_connections c ON c.id = t.connection_id WHERE c.name = $1`,
		name).Scan(&st.access, &st.refresh, &st.version, &st.sealed); err != nil {
		t.Fatal(err)
	}
	return st
}

// sandboxGrant is a fresh grant of the stack's sandbox as tokenctl import
// reads it.
func sandboxGrant(s *stack) (string, error) {
	tok, err := sandbox.Grant(context.Background(), s.sb.OAuth2Config(s.sb.URL))
	if err != nil {
		return "", err
	}
	b, err := json.Marshal(tok)
	return string(b), err
}
