package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/internal/sandbox"
)

// testConnections is a connection's life through the binaries: connected
// through a connect session that gives it metadata and tags, listed by
// GET /connections a page at a time (behind the API key, never with a
// token), disconnected with tokenctl disconnect --revoke while the server
// has its token cached: the provider sees the revocation and the server
// stops serving the connection.
func testConnections(t *testing.T, bin string) {
	s := newStack(t, bin, stackOpts{lifetime: time.Hour, skew: skew})
	s.env = append(s.env, "OAUTH_REVOCATION_URL="+sandbox.RevocationURL(s.sb.URL))
	s.migrate()
	server := s.start("server")
	defer s.stop(server)
	s.waitHealthy(server)

	// Bad session requests: nothing is created.
	expectJSONError(t, s, http.MethodPost, "/connect-sessions", http.StatusBadRequest, "unknown_provider", `{"connection":"acme","provider":"nowhere"}`)
	expectJSONError(t, s, http.MethodPost, "/connect-sessions", http.StatusBadRequest, "invalid_metadata", `{"connection":"acme","metadata":[1]}`)
	expectJSONError(t, s, http.MethodPost, "/connect-sessions", http.StatusBadRequest, "invalid_metadata",
		`{"connection":"acme","tags":["a","has space"]}`)

	// The consent gives acme the session's metadata and tags.
	s.connectVia("acme", `,"metadata":{"tenant":"t1","end_user":42},"tags":["crm","eu"]`, "", "")
	var imported []string // refresh tokens that must never show
	for i := range 5 {
		tok, err := sandbox.Grant(context.Background(), s.sb.OAuth2Config(s.sb.URL))
		if err != nil {
			t.Fatal(err)
		}
		imported = append(imported, tok.AccessToken, tok.RefreshToken)
		js, _ := json.Marshal(tok)
		if r := run(t, bin, "tokenctl", s.env, string(js), "import", "--connection", fmt.Sprintf("b%d", i),
			"--metadata", fmt.Sprintf(`{"tenant":"t%d"}`, i)); r.code != 0 {
			t.Fatalf("tokenctl import: exit %d: %s", r.code, r.stderr)
		}
	}

	for _, key := range []string{"", "tgk_not-a-key"} {
		if code, body := s.doWith(key, http.MethodGet, "/connections", ""); code != http.StatusUnauthorized {
			t.Errorf("GET /connections with key %q: %d %s", key, code, body)
		}
	}
	expectJSONError(t, s, http.MethodGet, "/connections?limit=0", http.StatusBadRequest, "bad_request")
	expectJSONError(t, s, http.MethodGet, "/connections?limit=1001", http.StatusBadRequest, "bad_request")

	all, pages := listAllConnections(t, s, imported)
	var names []string
	for _, c := range all {
		names = append(names, c.Connection)
	}
	if want := []string{"acme", "b0", "b1", "b2", "b3", "b4"}; !slices.Equal(names, want) || pages != 3 {
		t.Fatalf("listed %v in %d pages, want %v in 3", names, pages, want)
	}
	acme := all[0]
	if acme.Status != "active" || acme.Provider == nil || *acme.Provider != "" || acme.Expiry == nil ||
		string(acme.Metadata) != `{"tenant":"t1","end_user":42}` || !slices.Equal(acme.Tags, []string{"crm", "eu"}) {
		t.Errorf("acme listed as %+v (metadata %s)", acme, acme.Metadata)
	}
	if string(all[1].Metadata) != `{"tenant":"t0"}` || all[1].Tags == nil || len(all[1].Tags) != 0 {
		t.Errorf("b0 listed as %+v (metadata %s)", all[1], all[1].Metadata)
	}

	// The server caches acme's token; tokenctl disconnect --revoke, a
	// process of its own, revokes and deletes it; the server stops
	// serving it.
	if code, body := s.do(http.MethodGet, "/connections/acme/resource", ""); code != http.StatusOK {
		t.Fatalf("acme before the disconnection: %d %s", code, body)
	}
	if r := run(t, bin, "tokenctl", s.env, "", "disconnect", "--connection", "acme", "--revoke"); r.code != 0 ||
		!strings.Contains(r.stdout, "revoked at the provider") {
		t.Fatalf("tokenctl disconnect --revoke: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if n := s.sb.Stats().Revocations; n != 1 {
		t.Errorf("the provider saw %d revocations, want 1", n)
	}
	// Until the announcement arrives, the cached access token (revoked
	// with its grant) may still be tried: the API answers 401.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		code, body := s.do(http.MethodGet, "/connections/acme/resource", "")
		if code == http.StatusNotFound {
			break
		}
		if (code != http.StatusOK && code != http.StatusUnauthorized) || time.Now().After(deadline) {
			t.Fatalf("acme after the disconnection: %d %s", code, body)
		}
	}
	if code, body := s.do(http.MethodGet, "/connections", ""); code != http.StatusOK || strings.Contains(body, `"acme"`) {
		t.Errorf("listing after the disconnection: %d %s", code, body)
	}
	if r := run(t, bin, "tokenctl", s.env, "", "status"); r.code != 0 || strings.Contains(r.stdout, "acme") ||
		!strings.Contains(r.stdout, "b3: metadata {\"tenant\":\"t3\"}") {
		t.Errorf("status after the disconnection: exit %d\n%s", r.code, r.stdout)
	}
}

// listedConnection is a connection as GET /connections lists it.
type listedConnection struct {
	Connection string          `json:"connection"`
	Provider   *string         `json:"provider"`
	Status     string          `json:"status"`
	Expiry     *time.Time      `json:"expiry"`
	Account    string          `json:"account"`
	Metadata   json.RawMessage `json:"metadata"`
	Tags       []string        `json:"tags"`
}

// listAllConnections pages through GET /connections two at a time; no
// page shows a token.
func listAllConnections(t *testing.T, s *stack, imported []string) (all []listedConnection, pages int) {
	t.Helper()
	for path := "/connections?limit=2"; ; {
		code, body := s.do(http.MethodGet, path, "")
		var page struct {
			Connections []listedConnection `json:"connections"`
			Next        *string            `json:"next"`
		}
		if code != http.StatusOK || json.Unmarshal([]byte(body), &page) != nil {
			t.Fatalf("GET %s: %d %s", path, code, body)
		}
		for _, secret := range imported {
			if strings.Contains(body, secret) {
				t.Fatalf("GET %s shows a token", path)
			}
		}
		if strings.Contains(body, "token\"") {
			t.Errorf("GET %s has a token field: %s", path, body)
		}
		pages++
		all = append(all, page.Connections...)
		if page.Next == nil {
			break
		}
		path = "/connections?limit=2&after=" + *page.Next
	}
	return all, pages
}
