package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokenguard/tokenguard/internal/sandbox"
)

// testFirstGrant: the browser flow's code exchange goes through the
// refresher's client. The sandbox takes the client only in the form body;
// with OAUTH_AUTH_STYLE at its default (auto) and no start-up check
// (TOKEN_ENDPOINT_CHECK=false), the exchange learns "params" after one
// invalid_client and remembers it, so the first refresh sends no probe.
// The profile's authorization parameters (zoho: access_type=offline,
// prompt=consent) are on the authorization request, its answer field
// (api_domain) is kept in the connection's metadata, and the answer's
// missing expires_in gets TOKEN_DEFAULT_LIFETIME at the first grant.
func testFirstGrant(t *testing.T, bin string) {
	const lifetime = 3 * time.Second
	const apiDomain = "https://www.zohoapis.eu"
	s := newStack(t, bin, stackOpts{lifetime: time.Hour, skew: 500 * time.Millisecond, clientAuth: sandbox.ClientAuthPost, omitExpiresIn: true,
		extraFields: map[string]string{"api_domain": apiDomain},
		// OAUTH_AUTH_STYLE=auto overrides the profile's params: the
		// exchange has to learn it.
		extraEnv: []string{"OAUTH_PROFILE=zoho", "OAUTH_AUTH_STYLE=auto", "TOKEN_ENDPOINT_CHECK=false", "TOKEN_DEFAULT_LIFETIME=" + lifetime.String()}})
	s.migrate()
	server := s.start("server")
	defer s.stop(server)
	s.waitHealthy(server)
	if !strings.Contains(server.Stderr(), "token endpoint check: off") {
		t.Errorf("TOKEN_ENDPOINT_CHECK=false: no line saying the check is off:\n%s", tail(server.Stderr(), 20))
	}

	browser := personAt(s, "", "")
	follow := browser.CheckRedirect
	browser.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, _ := press(t, browser, s.connectSession("acme", ""))
	auth, err := url.Parse(resp.Header.Get("Location"))
	if err != nil || resp.StatusCode != http.StatusSeeOther || auth.Query().Get("access_type") != "offline" || auth.Query().Get("prompt") != "consent" {
		t.Fatalf("authorization request %d %q: want the zoho profile's access_type=offline&prompt=consent", resp.StatusCode, resp.Header.Get("Location"))
	}
	browser.CheckRedirect = follow
	granted := time.Now()
	resp, b := get(t, browser, auth.String())
	back := returned(resp)
	if back == nil || back.Query().Get("status") != "pending" {
		t.Fatalf("connect flow: %s %s", resp.Status, b)
	}
	if code, _, raw := s.redeem(s.key, back.Query().Get("result")); code != http.StatusOK {
		t.Fatalf("redeem: %d %s", code, raw)
	}
	if style := storedStyle(t, s.dbURL); style != "params" {
		t.Errorf("auth style remembered after the code exchange: %q, want params", style)
	}
	code, body := s.do(http.MethodGet, "/connections", "")
	var page struct {
		Connections []struct {
			Expiry   *time.Time `json:"expiry"`
			Metadata struct {
				ProviderFields map[string]string `json:"provider_fields"`
			} `json:"metadata"`
		} `json:"connections"`
	}
	if code != http.StatusOK || json.Unmarshal([]byte(body), &page) != nil || len(page.Connections) != 1 || page.Connections[0].Expiry == nil ||
		page.Connections[0].Expiry.Sub(granted) < lifetime-time.Second || page.Connections[0].Expiry.Sub(granted) > lifetime+2*time.Second {
		t.Fatalf("GET /connections: %d %s; want an expiry TOKEN_DEFAULT_LIFETIME after the grant", code, body)
	}
	if got := page.Connections[0].Metadata.ProviderFields; len(got) != 1 || got["api_domain"] != apiDomain {
		t.Errorf("metadata provider_fields = %v, want the answer's api_domain", got)
	}
	// The first refresh uses the remembered style: no refused request.
	time.Sleep(time.Until(page.Connections[0].Expiry.Add(100 * time.Millisecond)))
	before := s.sb.Stats()
	if code, body := s.do(http.MethodGet, "/connections/acme/resource", ""); code != http.StatusOK {
		t.Fatalf("API call after expiry: %d %s", code, body)
	}
	if after := s.sb.Stats(); after.Refreshes != before.Refreshes+1 || after.RefreshRejected != before.RefreshRejected {
		t.Errorf("provider: %+v -> %+v; want one refresh and no refused request (no Basic probe)", before, after)
	}
}

// storedStyle is the client authentication style remembered in the
// database ("" when none).
func storedStyle(t *testing.T, dbURL string) string {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var style string
	if err := c.QueryRow(ctx, `SELECT coalesce(max(style), '') FROM tokenguard_client_auth_styles`).Scan(&style); err != nil {
		t.Fatal(err)
	}
	return style
}
