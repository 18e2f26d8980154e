package tokenctl_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/repository"
)

// provider add/update --token-rate N/PERIOD stores the budget; a
// malformed one is refused with exit 2 naming the form, and none removes
// it.
func TestProviderTokenRate(t *testing.T) {
	c := newCLI(t, 0)
	ctx := context.Background()
	providers := repository.NewProviderRepository(c.db, tokencrypt.Plaintext{})
	oc := c.p.OAuth2Config(c.srv.URL)
	rate := func() domain.TokenRate {
		t.Helper()
		p, err := providers.Get(ctx, "zoho-x")
		if err != nil {
			t.Fatal(err)
		}
		return p.TokenRate
	}
	for _, bad := range []string{"10", "10/10", "0/1m", "ten/1m"} {
		r := c.runIn("s\n", "provider", "add", "--name", "zoho-x", "--token-url", oc.Endpoint.TokenURL, "--client-id", oc.ClientID, "--token-rate", bad)
		if r.code != 2 || !strings.Contains(r.stderr, "--token-rate") || !strings.Contains(r.stderr, "N/PERIOD") {
			t.Errorf("--token-rate %s: %+v", bad, r)
		}
	}
	if r := c.runIn("s\n", "provider", "add", "--name", "zoho-x", "--token-url", oc.Endpoint.TokenURL, "--client-id", oc.ClientID, "--token-rate", "10/10m"); r.code != 0 {
		t.Fatalf("add: %+v", r)
	}
	if got := rate(); got != (domain.TokenRate{Limit: 10, Period: 10 * time.Minute}) {
		t.Errorf("added with %v", got)
	}
	if r := c.runIn("", "provider", "update", "--name", "zoho-x", "--token-rate", "100/1m"); r.code != 0 || rate() != (domain.TokenRate{Limit: 100, Period: time.Minute}) {
		t.Errorf("update to 100/1m: %+v, %v", r, rate())
	}
	if r := c.runIn("", "provider", "update", "--name", "zoho-x", "--skew", "5s"); r.code != 0 || rate() != (domain.TokenRate{Limit: 100, Period: time.Minute}) {
		t.Errorf("an update without --token-rate changed it: %+v, %v", r, rate())
	}
	if r := c.runIn("", "provider", "list"); r.code != 0 || !strings.HasSuffix(strings.Split(strings.TrimSpace(r.stdout), "\n")[1], " 100/1m") {
		t.Errorf("list does not end its row with the token rate: %+v", r)
	}
	if r := c.runIn("", "provider", "update", "--name", "zoho-x", "--token-rate", "none"); r.code != 0 || !rate().IsZero() {
		t.Errorf("--token-rate none: %+v, %v", r, rate())
	}
}
