package tokenctl_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/di"
	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/repository"
)

func (c *cli) runIn(stdin string, args ...string) result {
	var stdout, stderr bytes.Buffer
	code := di.RunTokenctl(args, c.environ, strings.NewReader(stdin), &stdout, &stderr)
	return result{code, stdout.String(), stderr.String()}
}

// The provider commands: the client secret comes from stdin only, is
// sealed at rest with TOKEN_ENCRYPTION_KEYS and never printed; update
// changes what it is given; import --provider refuses an unknown provider
// and stores nothing; remove is refused while a connection uses it.
func TestProviderCommands(t *testing.T) {
	c := newCLI(t, 0)
	ctx := context.Background()
	spec := "k1=" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))
	c.environ = append(c.environ, "TOKEN_ENCRYPTION_KEYS="+spec)
	keys, err := tokencrypt.ParseKeyring(spec)
	if err != nil {
		t.Fatal(err)
	}
	providers := repository.NewProviderRepository(c.db, keys)
	const first, second = "first-client-secret-0x5f3759df", "second-client-secret-0x1f"
	var outputs []string
	run := func(stdin string, args ...string) result {
		r := c.runIn(stdin, args...)
		outputs = append(outputs, r.stdout, r.stderr)
		return r
	}
	oc := c.p.OAuth2Config(c.srv.URL)
	add := []string{"provider", "add", "--name", "idp-x", "--token-url", oc.Endpoint.TokenURL, "--client-id", oc.ClientID,
		"--auth-style", "header", "--scopes", "api,offline", "--skew", "5s", "--revocation-url", c.srv.URL + "/revoke"}

	if r := run("", add...); r.code != 2 || !strings.Contains(r.stderr, "no client secret on stdin") {
		t.Fatalf("add without a secret: %+v", r)
	}
	if r := run("", append(add, first)...); r.code != 2 || !strings.Contains(r.stderr, "never from the command line") {
		t.Fatalf("add with the secret as an argument: %+v", r)
	}
	if r := run(first+"\n", add...); r.code != 0 || !strings.Contains(r.stdout, "added provider idp-x") {
		t.Fatalf("add: %+v", r)
	}
	if r := run(first+"\n", add...); r.code != 2 || !strings.Contains(r.stderr, "exists") {
		t.Fatalf("second add: %+v", r)
	}
	var raw string
	if err := c.db.Raw("SELECT client_secret FROM tokenguard_providers WHERE name = 'idp-x'").Scan(&raw).Error; err != nil {
		t.Fatal(err)
	}
	if strings.Contains(raw, first) || !keys.IsCurrent(raw) {
		t.Fatalf("client secret not sealed at rest: %q", raw)
	}
	p, err := providers.Get(ctx, "idp-x")
	if err != nil || p.ClientSecret.Reveal() != first || p.AuthStyle != domain.AuthStyleHeader ||
		strings.Join(p.Scopes, " ") != "api offline" || p.Skew.String() != "5s" || p.RevocationURL != c.srv.URL+"/revoke" {
		t.Fatalf("stored %+v, %v", p, err)
	}

	if r := run("", "provider", "update", "--name", "idp-x", "--skew", "0", "--api-base-url", c.srv.URL); r.code != 0 {
		t.Fatalf("update: %+v", r)
	}
	if p, err = providers.Get(ctx, "idp-x"); err != nil || p.ClientSecret.Reveal() != first || p.Skew != 0 || p.APIBaseURL != c.srv.URL || p.Version != 2 {
		t.Fatalf("after update without a secret: %+v, %v", p, err)
	}
	if r := run(second+"\n", "provider", "update", "--name", "idp-x", "--client-secret-stdin"); r.code != 0 || !strings.Contains(r.stdout, "client secret") {
		t.Fatalf("update of the secret: %+v", r)
	}
	if p, err = providers.Get(ctx, "idp-x"); err != nil || p.ClientSecret.Reveal() != second || p.Version != 3 || p.AuthStyle != domain.AuthStyleHeader {
		t.Fatalf("after the secret's update: %+v, %v", p, err)
	}
	if r := run("", "provider", "update", "--name", "nobody", "--skew", "1s"); r.code != 2 || !strings.Contains(r.stderr, "unknown provider") {
		t.Fatalf("update of an unknown provider: %+v", r)
	}
	if r := run("", "provider", "update", "--name", "idp-x", "--auth-style", "sideways"); r.code != 2 {
		t.Fatalf("bad auth style: %+v", r)
	}

	tok, err := sandbox.Grant(ctx, oc)
	if err != nil {
		t.Fatal(err)
	}
	js, _ := json.Marshal(tok)
	if r := run(string(js), "import", "--connection", "acme", "--provider", "nope"); r.code != 2 || !strings.Contains(r.stderr, "unknown provider") {
		t.Fatalf("import with an unknown provider: %+v", r)
	}
	if _, err := c.repo.Get(ctx, "acme"); !errors.Is(err, domain.ErrNotFound) {
		t.Fatalf("refused import stored something: %v", err)
	}
	if r := run(string(js), "import", "--connection", "acme", "--provider", "idp-x"); r.code != 0 || !strings.Contains(r.stdout, "provider idp-x") {
		t.Fatalf("import --provider: %+v", r)
	}
	if got, err := repository.NewTokenRepository(c.db, keys).Get(ctx, "acme"); err != nil || got.Provider != "idp-x" {
		t.Fatalf("imported: provider %q, %v", got.Provider, err)
	}

	r := run("", "provider", "list")
	if r.code != 0 || !strings.Contains(r.stdout, "idp-x") || !strings.Contains(r.stdout, "set") {
		t.Fatalf("list: %+v", r)
	}
	if lines := strings.Split(strings.TrimSpace(r.stdout), "\n"); len(lines) != 2 || !strings.HasSuffix(strings.Fields(lines[1])[11], "1") {
		t.Errorf("list: want one provider used by 1 connection:\n%s", r.stdout)
	}
	if r := run("", "provider", "remove", "--name", "idp-x"); r.code != 2 || !strings.Contains(r.stderr, "still used") {
		t.Fatalf("remove in use: %+v", r)
	}
	if r := run("", "provider", "remove", "--name", "nobody"); r.code != 2 {
		t.Fatalf("remove unknown: %+v", r)
	}
	for _, out := range outputs {
		if strings.Contains(out, first) || strings.Contains(out, second) {
			t.Errorf("a client secret was printed:\n%s", out)
		}
	}
}

// provider add --profile: the profile's URLs with their placeholders
// filled, its auth style, lifetime and keep-alive, and its name stored; a
// flag given on the command line wins; a missing required parameter and an
// unknown profile are exit 2, nothing stored.
func TestProviderAddProfile(t *testing.T) {
	c := newCLI(t, 0)
	ctx := context.Background()
	providers := repository.NewProviderRepository(c.db, tokencrypt.Plaintext{})
	if r := c.runIn("s\n", "provider", "add", "--profile", "okta", "--name", "okta", "--client-id", "cid"); r.code != 2 || !strings.Contains(r.stderr, "--param domain=") {
		t.Fatalf("okta without its domain: %+v", r)
	}
	if r := c.runIn("s\n", "provider", "add", "--profile", "nope", "--name", "x", "--client-id", "cid"); r.code != 2 || !strings.Contains(r.stderr, "unknown provider profile") {
		t.Fatalf("unknown profile: %+v", r)
	}
	if r := c.runIn("s\n", "provider", "add", "--profile", "okta", "--name", "okta", "--client-id", "cid", "--param", "domain=acme.okta.com", "--param", "tenant=x"); r.code != 2 || !strings.Contains(r.stderr, `no parameter "tenant"`) {
		t.Fatalf("a parameter okta does not take: %+v", r)
	}
	if list, _ := providers.List(ctx); len(list) != 0 {
		t.Fatalf("refused adds stored %d providers", len(list))
	}
	if r := c.runIn("s\n", "provider", "add", "--profile", "okta", "--name", "okta", "--client-id", "cid", "--param", "domain=acme.okta.com"); r.code != 0 {
		t.Fatalf("add okta: %+v", r)
	}
	ghe := "http://127.0.0.1:1/login/oauth/access_token"
	if r := c.runIn("s\n", "provider", "add", "--profile", "xero", "--name", "xero", "--client-id", "cid", "--token-url", ghe, "--default-lifetime", "5m"); r.code != 0 {
		t.Fatalf("add xero with overrides: %+v", r)
	}
	okta, err := providers.Get(ctx, "okta")
	if err != nil || okta.Profile != "okta" || okta.TokenURL != "https://acme.okta.com/oauth2/default/v1/token" ||
		okta.RevocationURL != "https://acme.okta.com/oauth2/default/v1/revoke" || okta.DefaultLifetime != time.Hour {
		t.Fatalf("okta stored as %+v, %v", okta, err)
	}
	xero, err := providers.Get(ctx, "xero")
	if err != nil || xero.Profile != "xero" || xero.TokenURL != ghe || xero.AuthURL != "https://login.xero.com/identity/connect/authorize" ||
		xero.AuthStyle != domain.AuthStyleHeader || xero.DefaultLifetime != 5*time.Minute || xero.KeepAlive != 30*24*time.Hour {
		t.Fatalf("xero stored as %+v, %v", xero, err)
	}
	r := c.runIn("", "provider", "profiles")
	if r.code != 0 || strings.Count(r.stdout, "https://") < 17 || !strings.Contains(r.stdout, "bad_refresh_token") {
		t.Fatalf("profiles: %+v", r)
	}
	if r := c.runIn("", "provider", "list"); r.code != 0 || !strings.Contains(r.stdout, "okta ") {
		t.Fatalf("list: %+v", r)
	}

	// A token without an expiry gets its provider's default lifetime; one
	// for the OAUTH_* provider without a setting or a profile stays
	// without one.
	noExpiry := `{"access_token":"at-x","token_type":"Bearer","refresh_token":"rt-x"}`
	if r := c.runIn(noExpiry, "import", "--connection", "viaxero", "--provider", "xero"); r.code != 0 {
		t.Fatalf("import --provider xero: %+v", r)
	}
	if r := c.runIn(noExpiry, "import", "--connection", "plain"); r.code != 0 {
		t.Fatalf("import: %+v", r)
	}
	got, err := c.repo.Get(ctx, "viaxero")
	if err != nil || got.Expiry.Sub(time.Now().Add(5*time.Minute)).Abs() > time.Minute {
		t.Fatalf("imported under xero: expiry %v, %v; want its --default-lifetime 5m", got.Expiry, err)
	}
	if got, err := c.repo.Get(ctx, "plain"); err != nil || !got.Expiry.IsZero() {
		t.Fatalf("imported without a provider: expiry %v, %v; want none", got.Expiry, err)
	}
}
