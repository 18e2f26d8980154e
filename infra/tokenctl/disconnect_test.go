package tokenctl_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard"
	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/prom"
	"github.com/tokenguard/tokenguard/usecase"
)

// withRevocation is the CLI's environment with the sandbox's revocation
// endpoint.
func (c *cli) withRevocation() []string {
	return append(c.environ[:len(c.environ):len(c.environ)], "OAUTH_REVOCATION_URL="+sandbox.RevocationURL(c.srv.URL))
}

func (c *cli) gone(name string) bool {
	c.t.Helper()
	var n int
	if err := c.db.Raw(`SELECT count(*) FROM tokenguard_tokens t JOIN tokenguard_connections c ON c.id = t.connection_id WHERE c.name = ?`, name).Scan(&n).Error; err != nil {
		c.t.Fatal(err)
	}
	return n == 0
}

// refreshAtProvider presents rt to the sandbox as a refresh would.
func (c *cli) refreshAtProvider(rt string) error {
	_, err := c.p.OAuth2Config(c.srv.URL).TokenSource(context.Background(), &oauth2.Token{RefreshToken: rt}).Token()
	return err
}

func isInvalidGrant(err error) bool {
	var re *oauth2.RetrieveError
	return errors.As(err, &re) && re.ErrorCode == "invalid_grant"
}

// Without --revoke the row goes and the provider hears nothing (the grant
// lives on there); with --revoke the provider revokes the current refresh
// token first. Without a revocation endpoint --revoke changes nothing and
// says what to do; a revocation the provider refuses keeps the connection.
func TestDisconnect(t *testing.T) {
	c := newCLI(t, time.Hour)
	plain, revoked, kept := c.grant("plain"), c.grant("revoked"), c.grant("kept")

	r := c.run(c.environ, "disconnect", "--connection", "plain")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "disconnected plain (was active at version 1): its refresh token was not revoked") {
		t.Fatalf("disconnect: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if !c.gone("plain") || c.p.Stats().Revocations != 0 {
		t.Errorf("after disconnect: gone %t, revocations %d", c.gone("plain"), c.p.Stats().Revocations)
	}
	if err := c.refreshAtProvider(plain.RefreshToken.Reveal()); err != nil {
		t.Errorf("the grant of a connection disconnected without --revoke died at the provider: %v", err)
	}

	// --revoke without OAUTH_REVOCATION_URL: exit 2, nothing changed.
	r = c.run(c.environ, "disconnect", "--connection", "kept", "--revoke")
	if r.code != 2 || !strings.Contains(r.stderr, "OAUTH_REVOCATION_URL") || !strings.Contains(r.stderr, "without --revoke") {
		t.Errorf("--revoke without an endpoint: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// The provider refuses the client: exit 1, nothing changed.
	wrongSecret := append(c.withRevocation(), "OAUTH_CLIENT_SECRET=wrong")
	r = c.run(wrongSecret, "disconnect", "--connection", "kept", "--revoke")
	if r.code != 1 || !strings.Contains(r.stderr, "the connection is kept") || !strings.Contains(r.stderr, "HTTP 401") {
		t.Errorf("refused revocation: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// The provider is down: exit 1, nothing changed.
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) }))
	defer down.Close()
	r = c.run(append(c.environ, "OAUTH_REVOCATION_URL="+down.URL), "disconnect", "--connection", "kept", "--revoke")
	if r.code != 1 || !strings.Contains(r.stderr, domain.ErrProviderUnavailable.Error()) {
		t.Errorf("provider down: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// Another process's refresh lost the lock mid-call (its lease runs):
	// the refresh token may be being rotated; revoking it is refused.
	if err := c.db.Exec(`INSERT INTO tokenguard_refresh_leases SELECT c.id, t.version, gen_random_uuid(), now() + interval '1 minute'
		FROM tokenguard_connections c JOIN tokenguard_tokens t ON t.connection_id = c.id WHERE c.name = 'kept'`).Error; err != nil {
		t.Fatal(err)
	}
	r = c.run(c.withRevocation(), "disconnect", "--connection", "kept", "--revoke")
	if r.code != 1 || !strings.Contains(r.stderr, domain.ErrRefreshInProgress.Error()) {
		t.Errorf("revocation under another process's lease: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if err := c.db.Exec(`DELETE FROM tokenguard_refresh_leases`).Error; err != nil {
		t.Fatal(err)
	}
	if c.gone("kept") || c.row("kept").RefreshToken != kept.RefreshToken.Reveal() || c.p.Stats().Revocations != 0 {
		t.Errorf("a failed revocation changed something: gone %t, revocations %d", c.gone("kept"), c.p.Stats().Revocations)
	}

	r = c.run(c.withRevocation(), "disconnect", "--connection", "revoked", "--revoke")
	if r.code != 0 || !strings.Contains(r.stdout, "its refresh token was revoked at the provider") {
		t.Fatalf("disconnect --revoke: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if !c.gone("revoked") || c.p.Stats().Revocations != 1 {
		t.Errorf("after disconnect --revoke: gone %t, revocations %d", c.gone("revoked"), c.p.Stats().Revocations)
	}
	if err := c.refreshAtProvider(revoked.RefreshToken.Reveal()); !isInvalidGrant(err) {
		t.Errorf("refresh of the revoked grant: %v, want invalid_grant", err)
	}

	for _, bad := range []struct {
		args   []string
		code   int
		stderr string
	}{
		{[]string{"disconnect", "--connection", "plain"}, 2, "tokenctl: disconnect: connection \"plain\" not found\n"},
		{[]string{"disconnect"}, 2, "tokenctl: disconnect: --connection NAME is required\n"},
	} {
		if r := c.run(c.environ, bad.args...); r.code != bad.code || r.stderr != bad.stderr {
			t.Errorf("%v: exit %d, stderr %q, want %d and %q", bad.args, r.code, r.stderr, bad.code, bad.stderr)
		}
	}
}

// A disconnection never revokes a refresh token that a refresh is
// presenting: while the refresh's lease runs it is refused and changes
// nothing; once the refresh stored its rotated token, it revokes that one,
// the current one. Revoking the one the refresh spent would revoke a token
// the provider has rotated away, and leave the grant alive (the sandbox's
// TestRevokingARotatedTokenLeavesTheGrant).
func TestDisconnectRevokesWhatTheRefreshStored(t *testing.T) {
	c := newCLI(t, time.Hour)
	ctx := context.Background()
	tok := c.grant("acme")

	// The refresh: its lease, then the provider.
	cl, err := c.repo.Claim(ctx, tok, time.Minute)
	if err != nil || cl.End == nil {
		t.Fatalf("claim: lease %t, %v", cl.End != nil, err)
	}
	next, err := c.p.OAuth2Config(c.srv.URL).TokenSource(ctx, &oauth2.Token{RefreshToken: cl.Token.RefreshToken.Reveal()}).Token()
	if err != nil {
		t.Fatal(err)
	}
	r := c.run(c.withRevocation(), "disconnect", "--connection", "acme", "--revoke")
	if r.code != 1 || !strings.Contains(r.stderr, domain.ErrRefreshInProgress.Error()) || !strings.Contains(r.stderr, "the connection is kept") {
		t.Fatalf("disconnect --revoke while the refresh's lease runs: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if c.gone("acme") || c.p.Stats().Revocations != 0 {
		t.Fatal("changed while the refresh's lease ran")
	}
	if _, err := c.repo.Store(ctx, cl.Token.Rotated(domain.Grant{AccessToken: domain.NewSecret(next.AccessToken), RefreshToken: domain.NewSecret(next.RefreshToken), Expiry: next.Expiry}, time.Now())); err != nil {
		t.Fatal(err)
	}
	cl.End(false)

	if r := c.run(c.withRevocation(), "disconnect", "--connection", "acme", "--revoke"); r.code != 0 || !strings.Contains(r.stdout, "(was active at version 2)") {
		t.Fatalf("after the refresh: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if err := c.refreshAtProvider(next.RefreshToken); !isInvalidGrant(err) {
		t.Errorf("the refresh token the refresh stored survived: %v", err)
	}
	if st := c.p.Stats(); st.Revocations != 1 || st.RefreshReuse != 0 {
		t.Errorf("provider: %+v", st)
	}
}

// A disconnection waits for the connection's lock held by another
// transaction, and revokes and deletes what it reads once it has it.
func TestDisconnectWaitsForTheLock(t *testing.T) {
	c := newCLI(t, time.Hour)
	tok := c.grant("acme")

	held := make(chan struct{})
	release := make(chan struct{})
	holder := make(chan error, 1)
	go func() {
		holder <- c.repo.InLock(context.Background(), "acme", time.Second, 30*time.Second, func(context.Context, usecase.LockedStore) error {
			close(held)
			<-release
			return nil
		})
	}()
	<-held
	done := make(chan result, 1)
	go func() { done <- c.run(c.withRevocation(), "disconnect", "--connection", "acme", "--revoke") }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var waiting int
		if err := c.db.Raw(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&waiting).Error; err != nil {
			t.Fatal(err)
		}
		if waiting == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("tokenctl never waited for the lock")
		}
	}
	select {
	case r := <-done:
		t.Fatalf("disconnected while the lock was held: %+v", r)
	default:
	}
	if c.gone("acme") || c.p.Stats().Revocations != 0 {
		t.Fatal("changed while the lock was held")
	}
	close(release)
	if err := <-holder; err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.code != 0 || !strings.Contains(r.stdout, "(was active at version 1)") {
		t.Fatalf("after the holder: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if !c.gone("acme") {
		t.Error("not deleted")
	}
	if err := c.refreshAtProvider(tok.RefreshToken.Reveal()); !isInvalidGrant(err) {
		t.Errorf("the refresh token read under the lock survived: %v", err)
	}
	if st := c.p.Stats(); st.Revocations != 1 || st.RefreshReuse != 0 {
		t.Errorf("provider: %+v", st)
	}
}

// A process that has the token cached stops serving it once the
// disconnection's announcement arrives. The control deletes a row behind
// the processes' backs, without an announcement: its cached token is still
// served, which shows that the process serves these tokens from its cache
// (a read-through would have found them gone at once).
func TestDisconnectReachesEveryProcessCache(t *testing.T) {
	c := newCLI(t, time.Hour)
	c.grant("acme")
	c.grant("control")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reg := prometheus.NewRegistry()
	tokens, err := tokenguard.New(c.db, c.p.OAuth2Config(c.srv.URL), prom.WithMetrics(reg),
		tokenguard.WithListenDSN(strings.TrimPrefix(c.environ[0], "DATABASE_URL=")))
	if err != nil {
		t.Fatal(err)
	}
	defer tokens.Close(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); _ = tokens.Run(ctx) }()
	defer func() { cancel(); <-ran }()
	for deadline := time.Now().Add(10 * time.Second); listening(t, reg) != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the listener never connected")
		}
	}
	for _, name := range []string{"acme", "control"} {
		if _, err := tokens.Token(ctx, name); err != nil { // cached from now on
			t.Fatal(err)
		}
	}

	if err := c.db.Exec(`DELETE FROM tokenguard_tokens WHERE connection_id = (SELECT id FROM tokenguard_connections WHERE name = 'control')`).Error; err != nil {
		t.Fatal(err)
	}
	if _, err := tokens.Token(ctx, "control"); err != nil {
		t.Fatalf("control: a token deleted without an announcement: %v; want it still served from the cache", err)
	}

	if r := c.run(c.environ, "disconnect", "--connection", "acme"); r.code != 0 {
		t.Fatalf("disconnect: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		_, err := tokens.Token(ctx, "acme")
		if errors.Is(err, tokenguard.ErrNotFound) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the process still serves the disconnected connection's token")
		}
	}
	if _, err := tokens.Token(ctx, "control"); err != nil {
		t.Errorf("control after the announcement of another connection: %v", err)
	}
}

// listening reads tokenguard_token_listener_connected.
func listening(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "tokenguard_token_listener_connected" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return 0
}

// A connection of a stored provider is revoked at that provider's
// revocation endpoint, with its client; one whose provider has no
// revocation URL is kept, and the message says where to set it.
func TestDisconnectRevokesAtTheConnectionsProvider(t *testing.T) {
	c := newCLI(t, time.Hour)
	other, err := sandbox.New(sandbox.Options{ClientID: "other-client", ClientSecret: "other-secret"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(other.Handler())
	defer srv.Close()
	oc := other.OAuth2Config(srv.URL)
	for _, p := range []struct{ name, revocation string }{{"with-revocation", sandbox.RevocationURL(srv.URL)}, {"without", ""}} {
		args := []string{"provider", "add", "--name", p.name, "--token-url", oc.Endpoint.TokenURL, "--client-id", oc.ClientID}
		if p.revocation != "" {
			args = append(args, "--revocation-url", p.revocation)
		}
		if r := c.runIn(oc.ClientSecret+"\n", args...); r.code != 0 {
			t.Fatalf("provider add: %+v", r)
		}
	}
	grants := map[string]string{}
	for _, conn := range []struct{ name, provider string }{{"b1", "with-revocation"}, {"b2", "without"}} {
		tok, err := sandbox.Grant(context.Background(), oc)
		if err != nil {
			t.Fatal(err)
		}
		grants[conn.name] = tok.RefreshToken
		body, _ := json.Marshal(tok)
		if r := c.runIn(string(body), "import", "--connection", conn.name, "--provider", conn.provider); r.code != 0 {
			t.Fatalf("import: %+v", r)
		}
	}

	r := c.run(c.withRevocation(), "disconnect", "--connection", "b2", "--revoke")
	if r.code != 2 || !strings.Contains(r.stderr, "provider without") || !strings.Contains(r.stderr, "tokenctl provider update --revocation-url") {
		t.Errorf("provider without a revocation URL: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if c.gone("b2") {
		t.Error("b2 deleted although its revocation was impossible")
	}
	// OAUTH_REVOCATION_URL (the first sandbox) is not b1's provider's.
	if r := c.run(c.withRevocation(), "disconnect", "--connection", "b1", "--revoke"); r.code != 0 {
		t.Fatalf("disconnect --revoke: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if got, env := other.Stats().Revocations, c.p.Stats().Revocations; got != 1 || env != 0 {
		t.Errorf("revocations: %d at b1's provider, %d at the OAUTH_* one; want 1 and 0", got, env)
	}
	if err := func() error {
		_, err := oc.TokenSource(context.Background(), &oauth2.Token{RefreshToken: grants["b1"]}).Token()
		return err
	}(); !isInvalidGrant(err) {
		t.Errorf("b1's grant after the revocation: %v", err)
	}
}
