package tokenguard_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard"
	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/waitfor"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// idp is a sandbox provider served over HTTP, registered (or to be) as a
// stored provider.
type idp struct {
	name string
	p    *sandbox.Provider
	srv  *httptest.Server
}

func newIDP(t *testing.T, name string, opts sandbox.Options) *idp {
	t.Helper()
	p, err := sandbox.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p.Handler())
	t.Cleanup(srv.Close)
	return &idp{name: name, p: p, srv: srv}
}

// stored is the provider as tokenctl provider add would store it: auth
// style auto, whatever the sandbox accepts.
func (i *idp) stored() domain.Provider {
	oc := i.p.OAuth2Config(i.srv.URL)
	return domain.Provider{Name: i.name, TokenURL: oc.Endpoint.TokenURL, AuthURL: oc.Endpoint.AuthURL,
		APIBaseURL: i.srv.URL, ClientID: oc.ClientID, ClientSecret: domain.NewSecret(oc.ClientSecret), AuthStyle: domain.AuthStyleAuto}
}

// connect stores a fresh grant of i as connection, naming i.
func (i *idp) connect(t *testing.T, db *gorm.DB, connection string) {
	t.Helper()
	tok, err := sandbox.Grant(context.Background(), i.p.OAuth2Config(i.srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	c := usecase.NewConnectUseCase(repository.NewTokenRepository(db, tokencrypt.Plaintext{}), nil, 0)
	if _, err := c.ConnectGrant(context.Background(), connection, provider.GrantFrom(tok), usecase.ConnectRequest{Provider: i.name, AllowAccountChange: true}); err != nil {
		t.Fatal(err)
	}
}

// refreshAll refreshes every connection of tg once (refresh ahead with a
// window past every expiry).
func refreshAll(ctx context.Context, tg *tokenguard.Tokens, db *gorm.DB) (usecase.AheadReport, error) {
	return tg.UseCase().RefreshAhead(ctx, repository.NewTokenRepository(db, tokencrypt.Plaintext{}), 24*time.Hour, 4)
}

// Connections of three providers (the environment's, one that takes the
// client only by HTTP Basic, one only in the form body), each with its own
// client id and secret, refresh in one use case, each at its own provider;
// auto learns each provider's style apart; a connection naming a provider
// the process cannot find is refused without touching its row.
func TestConnectionsRefreshAtTheirOwnProvider(t *testing.T) {
	w := newWorld(t, sandbox.Options{AccessTokenLifespan: time.Hour})
	basic := newIDP(t, "idp-basic", sandbox.Options{ClientID: "client-b", ClientSecret: "secret-b", ClientAuth: sandbox.ClientAuthBasic, AccessTokenLifespan: time.Hour})
	post := newIDP(t, "idp-post", sandbox.Options{ClientID: "client-p", ClientSecret: "secret-p", ClientAuth: sandbox.ClientAuthPost, AccessTokenLifespan: time.Hour})
	ctx := context.Background()
	db := w.open(t, nil)
	if err := tokenguard.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	providers := repository.NewProviderRepository(db, tokencrypt.Plaintext{})
	if _, err := providers.Add(ctx, basic.stored()); err != nil {
		t.Fatal(err)
	}
	tg := newTokens(t, w, db, tokenguard.WithLogger(slog.New(slog.DiscardHandler)))
	// Registered after New: the process finds it when a connection names it.
	if _, err := providers.Add(ctx, post.stored()); err != nil {
		t.Fatal(err)
	}
	if err := tg.Import(ctx, "legacy", w.grant(t)); err != nil {
		t.Fatal(err)
	}
	basic.connect(t, db, "conn-basic")
	post.connect(t, db, "conn-post")

	for round := 1; round <= 2; round++ {
		rep, err := refreshAll(ctx, tg, db)
		if err != nil || rep.Refreshed != 3 || rep.Failed != 0 {
			t.Fatalf("round %d: %+v, %v", round, rep, err)
		}
		for _, c := range []struct {
			p    *sandbox.Provider
			name string
		}{{w.provider, "environment"}, {basic.p, basic.name}, {post.p, post.name}} {
			if s := c.p.Stats(); s.Refreshes != int64(round) || s.RefreshReuse != 0 {
				t.Errorf("round %d: %s saw %d refreshes, %d reuse; want %d, 0", round, c.name, s.Refreshes, s.RefreshReuse, round)
			}
		}
	}
	// auto: Basic first; the form-only provider answered it once, then
	// its style was remembered; the Basic-only one was never probed.
	if s := post.p.Stats(); s.RefreshRejected != 1 {
		t.Errorf("%s rejected %d requests, want 1 (one Basic probe)", post.name, s.RefreshRejected)
	}
	if s := basic.p.Stats(); s.RefreshRejected != 0 {
		t.Errorf("%s rejected %d requests, want 0", basic.name, s.RefreshRejected)
	}
	for conn, url := range map[string]string{"legacy": w.srv.URL, "conn-basic": basic.srv.URL, "conn-post": post.srv.URL} {
		if code := get(t, tg.Client(ctx, conn), url); code != 200 {
			t.Errorf("%s at its provider's API: %d", conn, code)
		}
	}
	// Another provider's access token is not one of basic's.
	if code := get(t, tg.Client(ctx, "conn-post"), basic.srv.URL); code != 401 {
		t.Errorf("conn-post at %s's API: %d, want 401", basic.name, code)
	}

	// A process that knows no stored provider (its registry holds only the
	// environment's) meets conn-basic: a typed error, nothing touched.
	before := mustGet(t, db, "conn-basic")
	repo := repository.NewTokenRepository(db, tokencrypt.Plaintext{})
	blind, err := usecase.NewRefreshTokenUseCase(repo, provider.Only(provider.NewRefresher(w.oauth, nil)), usecase.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := blind.RefreshAhead(ctx, repo, 24*time.Hour, 4)
	if !errors.Is(err, domain.ErrUnknownProvider) || !errors.Is(err, domain.ErrEndpointMisconfigured) || rep.Failed != 2 || rep.Refreshed != 1 {
		t.Fatalf("a process without stored providers: %+v, %v; want conn-basic and conn-post refused (ErrUnknownProvider)", rep, err)
	}
	after := mustGet(t, db, "conn-basic")
	if after.Version != before.Version || after.Status != domain.StatusActive || !after.RefreshToken.Equal(before.RefreshToken) {
		t.Errorf("row touched: version %d -> %d, status %s", before.Version, after.Version, after.Status)
	}
	if s := basic.p.Stats(); s.Refreshes != 2 {
		t.Errorf("%s called: %d refreshes", basic.name, s.Refreshes)
	}
}

func mustGet(t *testing.T, db *gorm.DB, connection string) domain.Token {
	t.Helper()
	tok, err := repository.NewTokenRepository(db, tokencrypt.Plaintext{}).Get(context.Background(), connection)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// A provider's client secret is rotated at the provider (the old one is
// refused at once, no overlap) and then with tokenctl provider update,
// while two processes refresh its connections over and over: in the
// window the refreshes are "client rejected" and touch no row; both
// processes pick the new secret up by NOTIFY, without a restart; every
// refresh after that succeeds; the provider sees no refresh-token reuse.
// The control is a process that keeps the secret it started with.
func TestRotatedClientSecretWithoutRestart(t *testing.T) {
	w := newWorld(t, sandbox.Options{AccessTokenLifespan: time.Hour})
	b := newIDP(t, "idp-b", sandbox.Options{ClientID: "client-b", ClientSecret: "secret-b1", ClientAuth: sandbox.ClientAuthBasic, AccessTokenLifespan: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	admin := w.open(t, nil)
	if err := tokenguard.Migrate(ctx, admin); err != nil {
		t.Fatal(err)
	}
	providers := repository.NewProviderRepository(admin, tokencrypt.Plaintext{})
	if _, err := providers.Add(ctx, b.stored()); err != nil {
		t.Fatal(err)
	}
	const conns = 4
	for i := range conns {
		b.connect(t, admin, fmt.Sprintf("conn-b%d", i))
	}
	var procs []*rotationProcess
	for range 2 {
		db := w.open(t, nil)
		tg := newTokens(t, w, db, tokenguard.WithListenDSN(w.url), tokenguard.WithLogger(slog.New(slog.DiscardHandler)))
		go func() { _ = tg.Run(ctx) }()
		procs = append(procs, &rotationProcess{tg: tg, db: db})
	}
	tg0 := procs[0].tg
	if err := tg0.Import(ctx, "legacy", w.grant(t)); err != nil {
		t.Fatal(err)
	}
	staleUC := staleSecretProcess(t, w, providers, admin)

	var (
		tally rotationTally
		wg    sync.WaitGroup
	)
	stop := make(chan struct{})
	for _, p := range procs {
		wg.Go(func() { p.refreshUntil(ctx, stop, &tally) })
	}
	waitfor.Until(t, 30*time.Second, "refreshes before the rotation", func() bool { return b.p.Stats().Refreshes >= 3*conns })

	b.p.RotateClientSecret("secret-b2", false)
	rejected := b.p.Stats().RefreshRejected
	waitfor.Until(t, 30*time.Second, "refreshes refused in the window", func() bool { return b.p.Stats().RefreshRejected >= rejected+3 })
	assertAllActive(t, admin)
	if _, err := providers.Update(ctx, "idp-b", func(p *domain.Provider) error {
		p.ClientSecret = domain.NewSecret("secret-b2")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		reg := p.tg.ProviderRegistry()
		waitfor.Until(t, 30*time.Second, "a process did not reload the provider", func() bool { v, _ := reg.Provider("idp-b"); return v.Version == 2 })
	}
	tally.switched.Store(true)
	base := b.p.Stats().Refreshes
	waitfor.Until(t, 30*time.Second, "refreshes after the switch", func() bool { return b.p.Stats().Refreshes >= base+6*conns })
	close(stop)
	wg.Wait()

	tally.check(t)
	if s := b.p.Stats(); s.RefreshReuse != 0 {
		t.Errorf("provider saw %d refresh-token reuse, want 0", s.RefreshReuse)
	}
	assertAllActive(t, admin)
	for i := range conns {
		conn := fmt.Sprintf("conn-b%d", i)
		if code := get(t, tg0.Client(ctx, conn), b.srv.URL); code != 200 {
			t.Errorf("%s at its API after the switch: %d", conn, code)
		}
	}
	checkStaleSecretRefused(t, staleUC, admin)
	t.Logf("provider: %d refreshes, %d rejected, %d reuse; %d refreshes failed in the window, %d after, %d refreshed after",
		b.p.Stats().Refreshes, b.p.Stats().RefreshRejected, b.p.Stats().RefreshReuse, tally.failedBefore.Load(), tally.failedAfter.Load(), tally.refreshedAfter.Load())
}

// rotationProcess is one process of TestRotatedClientSecretWithoutRestart.
type rotationProcess struct {
	tg *tokenguard.Tokens
	db *gorm.DB
}

// rotationTally counts the refreshes of the processes before and after
// both switched to the new secret.
type rotationTally struct {
	switched       atomic.Bool // both processes use the new secret
	failedBefore   atomic.Int64
	failedAfter    atomic.Int64
	refreshedAfter atomic.Int64
	mu             sync.Mutex
	afterErrs      []error
}

// refreshUntil refreshes every connection over and over until stop is
// closed, counting in tally.
func (p *rotationProcess) refreshUntil(ctx context.Context, stop <-chan struct{}, tally *rotationTally) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		after := tally.switched.Load()
		rep, err := refreshAll(ctx, p.tg, p.db)
		if !after {
			tally.failedBefore.Add(int64(rep.Failed))
			continue
		}
		tally.refreshedAfter.Add(int64(rep.Refreshed))
		if rep.Failed > 0 {
			tally.failedAfter.Add(int64(rep.Failed))
			tally.mu.Lock()
			tally.afterErrs = append(tally.afterErrs, err)
			tally.mu.Unlock()
		}
	}
}

// check: refreshes failed in the window, none after the switch, and some
// were refreshed after it.
func (tally *rotationTally) check(t *testing.T) {
	t.Helper()
	if tally.failedBefore.Load() == 0 {
		t.Error("no refresh failed in the window: the rotation was not exercised")
	}
	if n := tally.failedAfter.Load(); n != 0 {
		t.Errorf("%d refreshes failed after both processes reloaded the provider: %v", n, errors.Join(tally.afterErrs...))
	}
	if tally.refreshedAfter.Load() == 0 {
		t.Error("nothing refreshed after the switch")
	}
}

// staleSecretProcess is the control's process: its registry keeps the
// stored providers as they are now, whatever is updated later.
func staleSecretProcess(t *testing.T, w *world, providers *repository.ProviderRepository, db *gorm.DB) *usecase.RefreshTokenUseCase {
	t.Helper()
	ctx := context.Background()
	snapshot, err := providers.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stale := provider.NewRegistry(provider.NewRefresher(w.oauth, nil), staticProviders(snapshot),
		func(p domain.Provider) provider.GrantRefresher {
			return provider.NewRefresher(provider.OAuth2Config(p), nil)
		}, nil)
	if err := stale.Load(ctx); err != nil {
		t.Fatal(err)
	}
	uc, err := usecase.NewRefreshTokenUseCase(repository.NewTokenRepository(db, tokencrypt.Plaintext{}), stale, usecase.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return uc
}

// checkStaleSecretRefused is the control: the old secret, kept, is refused
// for good; the rows stay as they are (client rejected never marks a grant
// dead).
func checkStaleSecretRefused(t *testing.T, staleUC *usecase.RefreshTokenUseCase, db *gorm.DB) {
	t.Helper()
	before := mustGet(t, db, "conn-b0")
	rep, err := staleUC.RefreshAhead(context.Background(), repository.NewTokenRepository(db, tokencrypt.Plaintext{}), 24*time.Hour, 1)
	if !errors.Is(err, domain.ErrClientRejected) || rep.Failed == 0 {
		t.Errorf("a process keeping the old secret: %+v, %v; want client rejected", rep, err)
	}
	if after := mustGet(t, db, "conn-b0"); after.Version != before.Version || after.Status != domain.StatusActive {
		t.Errorf("the control touched the row: version %d -> %d, %s", before.Version, after.Version, after.Status)
	}
}

type staticProviders []domain.Provider

func (s staticProviders) List(context.Context) ([]domain.Provider, error) { return s, nil }

func assertAllActive(t *testing.T, db *gorm.DB) {
	t.Helper()
	var n int64
	if err := db.Raw("SELECT count(*) FROM tokenguard_tokens WHERE status <> 'active'").Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d connection(s) not active", n)
	}
}
