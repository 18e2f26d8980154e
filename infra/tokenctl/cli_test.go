package tokenctl_test

import (
	"bytes"
	"context"
	"errors"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/di"
	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/postgres"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/testdb"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// These tests run tokenctl in-process, with its real backend, against a
// real Postgres and the sandbox provider.

func TestMain(m *testing.M) { testdb.Main(m) }

type cli struct {
	t       *testing.T
	environ []string
	db      *gorm.DB
	repo    *repository.TokenRepository
	p       *sandbox.Provider
	srv     *httptest.Server
}

func newCLI(t *testing.T, lifespan time.Duration) *cli {
	t.Helper()
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	url := testdb.New(t)
	p, err := sandbox.New(sandbox.Options{AccessTokenLifespan: lifespan})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p.Handler())
	t.Cleanup(srv.Close)
	db, err := postgres.Open(context.Background(), url, postgres.Pool{MaxOpenConns: 4}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = postgres.Close(db) })
	oc := p.OAuth2Config(srv.URL)
	return &cli{t: t, db: db, repo: repository.NewTokenRepository(db, tokencrypt.Plaintext{}), p: p, srv: srv, environ: []string{
		"DATABASE_URL=" + url, "OAUTH_CLIENT_ID=" + oc.ClientID, "OAUTH_CLIENT_SECRET=" + oc.ClientSecret,
		"OAUTH_TOKEN_URL=" + oc.Endpoint.TokenURL, "API_BASE_URL=" + srv.URL,
		"TOKEN_LOCK_WAIT=5s", "TOKEN_REFRESH_TIMEOUT=2s", "MIGRATE_ON_START=false",
	}}
}

type result struct {
	code           int
	stdout, stderr string
}

func (c *cli) run(environ []string, args ...string) result {
	var stdout, stderr bytes.Buffer
	code := di.RunTokenctl(args, environ, strings.NewReader(""), &stdout, &stderr)
	return result{code, stdout.String(), stderr.String()}
}

// grant connects name with a real grant from the sandbox.
func (c *cli) grant(name string) domain.Token {
	c.t.Helper()
	tok, err := sandbox.Grant(context.Background(), c.p.OAuth2Config(c.srv.URL))
	if err != nil {
		c.t.Fatal(err)
	}
	connect := usecase.NewConnectUseCase(repository.NewTokenRepository(c.db, tokencrypt.Plaintext{}), nil, time.Second)
	stored, err := connect.Connect(context.Background(), name, provider.GrantFrom(tok))
	if err != nil {
		c.t.Fatal(err)
	}
	return stored
}

// markDead stores name as needs_reauth for reason, as a refresh that got
// that answer did (before client errors were told apart from dead grants).
func (c *cli) markDead(name, reason string) {
	c.t.Helper()
	ctx := context.Background()
	tok, err := c.repo.Get(ctx, name)
	if err != nil {
		c.t.Fatal(err)
	}
	tok.Status, tok.StatusReason = domain.StatusNeedsReauth, reason
	if _, err := c.repo.Store(ctx, tok); err != nil {
		c.t.Fatal(err)
	}
}

type row struct {
	AccessToken, RefreshToken, Status, StatusReason string
	Version                                         int64
}

func (c *cli) row(name string) row {
	c.t.Helper()
	var r row
	if err := c.db.Raw(`SELECT t.access_token, t.refresh_token, t.status, t.status_reason, t.version
		FROM tokenguard_tokens t JOIN tokenguard_connections c ON c.id = t.connection_id WHERE c.name = ?`, name).Scan(&r).Error; err != nil {
		c.t.Fatal(err)
	}
	return r
}

func TestReactivateConnection(t *testing.T) {
	c := newCLI(t, time.Second)
	c.grant("acme")
	c.markDead("acme", "invalid_client")
	before := c.row("acme")

	// Another process, with its own pool, cache and change listener.
	cfg, err := di.ConfigFromEnv(c.environ)
	if err != nil {
		t.Fatal(err)
	}
	other, closeOther, err := di.NewTokens(context.Background(), cfg, nil, di.TokenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer closeOther()
	if _, err := other.RefreshToken.Token(context.Background(), "acme"); !errors.Is(err, domain.ErrNeedsReauth) {
		t.Fatalf("before: err = %v, want ErrNeedsReauth", err)
	}

	r := c.run(c.environ, "reactivate", "--connection", "acme")
	want := "reactivated connection acme: was needs_reauth (invalid_client), now active at version " +
		itoa(before.Version+1) + "; the next refresh decides\n"
	if r.code != 0 || r.stdout != want || r.stderr != "" {
		t.Fatalf("reactivate: exit %d\n%s%s\nwant %s", r.code, r.stdout, r.stderr, want)
	}
	after := c.row("acme")
	if after != (row{before.AccessToken, before.RefreshToken, "active", "", before.Version + 1}) {
		t.Errorf("stored after reactivation %+v, before %+v", after, before)
	}

	// The grant was alive all along: the other process's next call
	// refreshes it (the access token has expired by now) and gets a token.
	stored, err := c.repo.Get(context.Background(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(stored.Expiry))
	refreshes := c.p.Stats().Refreshes
	tok, err := other.RefreshToken.Token(context.Background(), "acme")
	if err != nil || tok.Status != domain.StatusActive {
		t.Fatalf("after: %v, %v", tok, err)
	}
	if st := c.p.Stats(); st.Refreshes != refreshes+1 || st.RefreshReuse != 0 {
		t.Errorf("provider: %+v, want one refresh and no reuse", st)
	}

	// Already active: reported and left alone.
	r = c.run(c.environ, "reactivate", "--connection", "acme")
	now := c.row("acme")
	if r.code != 0 || r.stdout != "connection acme is already active (version "+itoa(now.Version)+"): left alone\n" {
		t.Errorf("already active: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if c.row("acme") != now {
		t.Errorf("an active connection was written")
	}

	for _, bad := range []struct {
		args   []string
		stderr string
	}{
		{[]string{"reactivate", "--connection", "nobody"}, "tokenctl: reactivate: connection \"nobody\" not found\n"},
		{[]string{"reactivate"}, "tokenctl: reactivate: give either --connection NAME or --all-with-reason REASON\n"},
		{[]string{"reactivate", "--connection", "acme", "--all-with-reason", "invalid_client"},
			"tokenctl: reactivate: give either --connection NAME or --all-with-reason REASON\n"},
		{[]string{"reactivate", "--connection", "no/slash"},
			"tokenctl: invalid connection name: \"no/slash\" (want 1-128 of A-Z a-z 0-9 . _ -, starting with a letter or digit)\n"},
	} {
		if r := c.run(c.environ, bad.args...); r.code != 2 || r.stderr != bad.stderr {
			t.Errorf("%v: exit %d, stderr %q, want 2 and %q", bad.args, r.code, r.stderr, bad.stderr)
		}
	}
}

func TestReactivateAllWithReason(t *testing.T) {
	c := newCLI(t, time.Hour)
	names := []string{"a1", "a2", "a3", "a4", "a5"}
	for _, n := range names {
		c.grant(n)
		c.markDead(n, "invalid_client")
	}
	c.grant("dead")
	c.markDead("dead", "invalid_grant")
	c.grant("alive")
	untouched := map[string]row{"dead": c.row("dead"), "alive": c.row("alive")}
	before := map[string]row{}
	for _, n := range names {
		before[n] = c.row(n)
	}

	r := c.run(c.environ, "reactivate", "--all-with-reason", "invalid_client")
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	if len(lines) != len(names)+1 || lines[len(lines)-1] != "reactivated 5 connection(s) marked needs_reauth for invalid_client" {
		t.Errorf("output:\n%s", r.stdout)
	}
	for i, n := range names {
		b := before[n]
		if got := c.row(n); got != (row{b.AccessToken, b.RefreshToken, "active", "", b.Version + 1}) {
			t.Errorf("%s: %+v, was %+v", n, got, b)
		}
		if i < len(lines) && !strings.HasPrefix(lines[i], "reactivated connection "+n+": was needs_reauth (invalid_client)") {
			t.Errorf("line %d: %q", i, lines[i])
		}
	}
	for n, was := range untouched {
		if got := c.row(n); got != was {
			t.Errorf("%s changed: %+v, was %+v", n, got, was)
		}
	}
	// Nothing left to do is no error.
	if r := c.run(c.environ, "reactivate", "--all-with-reason", "invalid_client"); r.code != 0 ||
		r.stdout != "reactivated 0 connection(s) marked needs_reauth for invalid_client\n" {
		t.Errorf("second run: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

func TestReactivateWaitsForTheRefreshLock(t *testing.T) {
	c := newCLI(t, time.Hour)
	c.grant("acme")
	c.markDead("acme", "invalid_client")

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
	go func() { done <- c.run(c.environ, "reactivate", "--connection", "acme") }()
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
		t.Fatalf("reactivated while the lock was held: %+v", r)
	default:
	}
	if c.row("acme").Status != "needs_reauth" {
		t.Fatal("written while the lock was held")
	}
	close(release)
	if err := <-holder; err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.code != 0 || !strings.HasPrefix(r.stdout, "reactivated connection acme") {
		t.Errorf("after the holder: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// A lock held past TOKEN_LOCK_WAIT: exit 1, nothing written.
	c.markDead("acme", "invalid_client")
	release = make(chan struct{})
	held = make(chan struct{})
	go func() {
		holder <- c.repo.InLock(context.Background(), "acme", time.Second, 30*time.Second, func(context.Context, usecase.LockedStore) error {
			close(held)
			<-release
			return nil
		})
	}()
	<-held
	r := c.run(append(c.environ, "TOKEN_LOCK_WAIT=300ms", "TOKEN_REFRESH_TIMEOUT=100ms"), "reactivate", "--all-with-reason", "invalid_client")
	close(release)
	if err := <-holder; err != nil {
		t.Fatal(err)
	}
	if r.code != 1 || !strings.Contains(r.stderr, "tokenctl: reactivate: acme: ") || !strings.Contains(r.stderr, domain.ErrLockTimeout.Error()) ||
		!strings.Contains(r.stderr, "1 connection(s) skipped") {
		t.Errorf("held lock: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if c.row("acme").Status != "needs_reauth" {
		t.Error("written despite the lock timeout")
	}
}

func TestCheck(t *testing.T) {
	c := newCLI(t, time.Hour)
	live := c.grant("acme")
	c.p.ResetStats()
	set := func(kv ...string) []string { return append(slices.Clone(c.environ), kv...) }

	r := c.run(set(), "check")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "ok: "+c.srv.URL+"/oauth2/token accepted the client with OAUTH_AUTH_STYLE=header") || r.stderr != "" {
		t.Errorf("check: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = c.run(set("OAUTH_AUTH_STYLE=auto"), "check")
	if r.code != 0 || !strings.Contains(r.stdout, "OAUTH_AUTH_STYLE=header") {
		t.Errorf("check, auto: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = c.run(set("OAUTH_CLIENT_SECRET=wrong-secret"), "check")
	if r.code != 1 || !strings.HasPrefix(r.stdout, "client rejected: ") || strings.Contains(r.stdout+r.stderr, "wrong-secret") {
		t.Errorf("check, wrong secret: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = c.run(set("OAUTH_TOKEN_URL="+c.srv.URL+"/token"), "check")
	if r.code != 1 || !strings.Contains(r.stdout, "HTTP 404, not found (check OAUTH_TOKEN_URL)") {
		t.Errorf("check, 404: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = c.run(set("OAUTH_CLIENT_SECRET=", "OAUTH_CLIENT_SECERT=a-secret"), "check")
	if r.code != 1 || r.stderr != "tokenctl: warning: OAUTH_CLIENT_SECERT is not a tokenguard setting and is ignored; did you mean OAUTH_CLIENT_SECRET?\n"+
		"tokenctl: warning: OAUTH_CLIENT_SECRET is empty: the token endpoint will reject a confidential client (invalid_client)\n" {
		t.Errorf("check, misspelt secret: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, bad := range []struct {
		environ []string
		stderr  string
	}{
		{set("OAUTH_TOKEN_URL="), "tokenctl: OAUTH_TOKEN_URL is required\n"},
		{set("OAUTH_TOKEN_URL=/token"), "tokenctl: OAUTH_TOKEN_URL must be an http(s) URL, got \"/token\"\n"},
		{set("OAUTH_AUTH_STYLE=basic"), "tokenctl: OAUTH_AUTH_STYLE must be auto, header, params or private_key_jwt, got \"basic\"\n"},
	} {
		environ := append(bad.environ, "OAUTH_CLIENT_SECRET=s")
		if r := c.run(environ, "check"); r.code != 2 || r.stderr != bad.stderr {
			t.Errorf("%v: exit %d, stderr %q, want 2 and %q", bad.environ, r.code, r.stderr, bad.stderr)
		}
	}

	// No check spent a refresh token: the provider refreshed nothing, and
	// the stored grant still refreshes.
	if st := c.p.Stats(); st.Refreshes != 0 || st.RefreshReuse != 0 {
		t.Errorf("provider after the checks: %+v", st)
	}
	if _, err := provider.NewRefresher(c.p.OAuth2Config(c.srv.URL), nil).Refresh(context.Background(), live.RefreshToken); err != nil {
		t.Errorf("the stored grant after the checks: %v", err)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
