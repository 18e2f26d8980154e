package usecase_test

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/oauth2"
	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/di"
	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/apiclient"
	"github.com/tokenguard/tokenguard/infra/postgres"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/testdb"
	"github.com/tokenguard/tokenguard/internal/waitfor"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// These tests run the use case against a real Postgres and the strict
// sandbox provider (fosite: rotation on every refresh, the previous access
// token revoked by a refresh, reuse answered with invalid_grant).

func TestMain(m *testing.M) {
	testdb.Main(m)
}

const conn = "acme"

// world is one provider and one database shared by several stacks.
type world struct {
	url      string
	provider *sandbox.Provider
	srv      *httptest.Server
	oauth    *oauth2.Config
}

// stack is what one OS process of an app holds: its own pool and use case.
type stack struct {
	db   *gorm.DB
	repo *repository.TokenRepository
	uc   *usecase.RefreshTokenUseCase
}

func newWorld(t testing.TB, lifespan time.Duration) *world {
	t.Helper()
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	p, err := sandbox.New(sandbox.Options{AccessTokenLifespan: lifespan})
	if err != nil {
		t.Fatal(err)
	}
	return newWorldWith(t, p)
}

// newWorldWith serves p and gives the world its own database.
func newWorldWith(t testing.TB, p *sandbox.Provider) *world {
	t.Helper()
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	return newWorldOn(t, p, testdb.New(t))
}

// newWorldOn serves p, with the database at url.
func newWorldOn(t testing.TB, p *sandbox.Provider, url string) *world {
	t.Helper()
	srv := httptest.NewServer(p.Handler())
	t.Cleanup(srv.Close)
	return &world{url: url, provider: p, srv: srv, oauth: p.OAuth2Config(srv.URL)}
}

func (w *world) stack(t testing.TB, opts usecase.Options) *stack {
	t.Helper()
	db, err := postgres.Open(context.Background(), w.url, postgres.Pool{MaxOpenConns: 10}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = postgres.Close(db) })
	uc, err := di.NewRefreshTokenUseCase(db, provider.NewRefresher(w.oauth, provider.NewHTTPClient(5*time.Second)), opts)
	if err != nil {
		t.Fatal(err)
	}
	return &stack{db: db, repo: repository.NewTokenRepository(db, tokencrypt.Plaintext{}), uc: uc}
}

// connect runs the real authorization-code flow and stores the first token.
func (w *world) connect(t testing.TB, s *stack) domain.Token {
	t.Helper()
	tok, err := sandbox.Grant(context.Background(), w.oauth)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := di.NewConnectUseCase(s.db, time.Second).Connect(context.Background(), conn, provider.GrantFrom(tok))
	if err != nil {
		t.Fatal(err)
	}
	return stored
}

// callResource calls the protected API and returns the status code.
func (w *world) callResource(t testing.TB, accessToken string) int {
	req, _ := http.NewRequest(http.MethodGet, w.srv.URL+"/resource", nil)
	req.Header.Set("Authorization", "Bearer "+accessToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("resource: %v", err)
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// waitUntilStale sleeps until the stored token is due for refresh.
func waitUntilStale(t testing.TB, s *stack, skew time.Duration) {
	t.Helper()
	tok, err := s.repo.Get(context.Background(), conn)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(tok.Expiry.Add(-tok.EffectiveSkew(skew))) + 5*time.Millisecond)
}

func TestStormAtExpiryRefreshesOncePerCycle(t *testing.T) {
	const (
		lifespan   = 3 * time.Second
		skew       = time.Second
		processes  = 3
		goroutines = 50
		cycles     = 3
	)
	w := newWorld(t, lifespan)
	opts := usecase.Options{Skew: skew, LockWait: 10 * time.Second, RefreshTimeout: 5 * time.Second}
	stacks := make([]*stack, processes)
	for i := range stacks {
		stacks[i] = w.stack(t, opts)
	}
	w.connect(t, stacks[0])

	// Calls keep flowing from every process between and during the storms,
	// through the client the apps use: a call in flight when another
	// process refreshes meets a 401, which the client recovers.
	var flowCalls, flowFailures atomic.Int64
	stop := make(chan struct{})
	var flow sync.WaitGroup
	for _, s := range stacks {
		client, err := apiclient.New(w.srv.URL, apiclient.TokenClients(s.uc), apiclient.Options{})
		if err != nil {
			t.Fatal(err)
		}
		flow.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(7 * time.Millisecond):
				}
				flowCalls.Add(1)
				if err := client.Call(context.Background(), conn, "/resource"); err != nil {
					flowFailures.Add(1)
					t.Logf("flow call failed: %v", err)
				}
			}
		})
	}

	for cycle := 1; cycle <= cycles; cycle++ {
		// Counted from the end of the previous cycle: the flowing calls
		// may meet the expiry a moment before the storm does.
		before := w.provider.Stats()
		waitUntilStale(t, stacks[0], skew)
		start := make(chan struct{})
		type result struct {
			tok    domain.Token
			err    error
			status int
		}
		results := make(chan result, processes*goroutines)
		var wg sync.WaitGroup
		for _, s := range stacks {
			for range goroutines {
				wg.Go(func() {
					<-start
					tok, err := s.uc.Token(context.Background(), conn)
					r := result{tok: tok, err: err}
					if err == nil {
						r.status = w.callResource(t, tok.AccessToken.Reveal())
					}
					results <- r
				})
			}
		}
		close(start)
		wg.Wait()
		close(results)

		var first domain.Token
		n := 0
		for r := range results {
			n++
			if r.err != nil {
				t.Fatalf("cycle %d: Token: %v", cycle, r.err)
			}
			if r.status != http.StatusOK {
				t.Errorf("cycle %d: protected call with the new token answered %d", cycle, r.status)
			}
			if first.Version == 0 {
				first = r.tok
			}
			if !r.tok.AccessToken.Equal(first.AccessToken) || r.tok.Version != first.Version {
				t.Errorf("cycle %d: callers got different tokens (versions %d and %d)", cycle, r.tok.Version, first.Version)
			}
		}
		after := w.provider.Stats()
		refreshes, reuse := after.Refreshes-before.Refreshes, after.RefreshReuse-before.RefreshReuse
		t.Logf("cycle %d: %d callers in %d processes; provider saw %d refresh(es) this expiry, %d reuse; all callers share version %d",
			cycle, n, processes, refreshes, reuse, first.Version)
		if refreshes != 1 || reuse != 0 {
			t.Errorf("cycle %d: provider saw %d refreshes and %d reuses, want exactly 1 and 0", cycle, refreshes, reuse)
		}
	}
	close(stop)
	flow.Wait()
	total := w.provider.Stats()
	t.Logf("background flow: %d calls, %d failures; provider total: %d refreshes, %d reuse, %d resource 401s",
		flowCalls.Load(), flowFailures.Load(), total.Refreshes, total.RefreshReuse, total.Resource401)
	if flowFailures.Load() != 0 || total.RefreshReuse != 0 {
		t.Errorf("background flow saw %d failures and the provider %d reuses, want 0 and 0", flowFailures.Load(), total.RefreshReuse)
	}
	if total.Refreshes < cycles || total.Refreshes > cycles+1 {
		// The flow may trigger one more refresh after the last storm.
		t.Errorf("provider saw %d refreshes over %d cycles", total.Refreshes, cycles)
	}
}

// The negative controls prove the provider is strict enough that the storm
// test above would fail if the lock or the re-check were missing.

func TestControlRefreshWithoutLockIsCaughtAsReuse(t *testing.T) {
	w := newWorld(t, 2*time.Second)
	stacks := []*stack{w.stack(t, usecase.Options{}), w.stack(t, usecase.Options{}), w.stack(t, usecase.Options{})}
	w.connect(t, stacks[0])
	refresher := provider.NewRefresher(w.oauth, nil)

	// Broken strategy: read, refresh, then write, with nothing held
	// across the three steps.
	var failures atomic.Int64
	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, s := range stacks {
		for range 50 {
			wg.Go(func() {
				<-start
				ctx := context.Background()
				tok, err := s.repo.Get(ctx, conn)
				if err != nil {
					t.Error(err)
					return
				}
				g, err := refresher.Refresh(ctx, tok.RefreshToken)
				if err != nil {
					failures.Add(1)
					return
				}
				_ = s.repo.InLock(ctx, conn, 10*time.Second, time.Second, func(ctx context.Context, l usecase.LockedStore) error {
					_, err := l.Put(ctx, tok.Rotated(g, time.Now()))
					return err
				})
			})
		}
	}
	close(start)
	wg.Wait()
	st := w.provider.Stats()
	t.Logf("no lock: %d refreshes succeeded, %d reuses detected, %d callers failed", st.Refreshes, st.RefreshReuse, failures.Load())
	if st.RefreshReuse == 0 || failures.Load() == 0 {
		t.Fatalf("the provider did not catch the unlocked race (reuse=%d, failures=%d)", st.RefreshReuse, failures.Load())
	}
	// RFC 9700: the reuse killed the whole grant, so the connection is dead.
	if _, err := refresher.Refresh(context.Background(), mustGet(t, stacks[0]).RefreshToken); !errors.Is(err, domain.ErrGrantRevoked) {
		t.Errorf("after reuse the stored refresh token still works: %v", err)
	}
}

func TestControlRefreshOnEveryCallBreaksInFlightCalls(t *testing.T) {
	w := newWorld(t, time.Hour)
	stacks := []*stack{w.stack(t, usecase.Options{}), w.stack(t, usecase.Options{}), w.stack(t, usecase.Options{})}
	w.connect(t, stacks[0])
	refresher := provider.NewRefresher(w.oauth, nil)

	// Broken strategy: serialised, but refreshing on every call (what the
	// original system did). Each refresh revokes the token another caller
	// is about to use.
	var calls, unauthorized atomic.Int64
	var wg sync.WaitGroup
	for _, s := range stacks {
		for range 10 {
			wg.Go(func() {
				for range 5 {
					var at string
					err := s.repo.InLock(context.Background(), conn, 20*time.Second, 5*time.Second, func(ctx context.Context, l usecase.LockedStore) error {
						tok, err := l.Get(ctx, conn)
						if err != nil {
							return err
						}
						g, err := refresher.Refresh(ctx, tok.RefreshToken)
						if err != nil {
							return err
						}
						saved, err := l.Put(ctx, tok.Rotated(g, time.Now()))
						at = saved.AccessToken.Reveal()
						return err
					})
					if err != nil {
						t.Error(err)
						return
					}
					calls.Add(1)
					if w.callResource(t, at) == http.StatusUnauthorized {
						unauthorized.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	st := w.provider.Stats()
	t.Logf("refresh on every call: %d calls, %d answered 401 (provider counted %d), %d reuses", calls.Load(), unauthorized.Load(), st.Resource401, st.RefreshReuse)
	if unauthorized.Load() == 0 {
		t.Fatal("no call failed: the provider does not revoke access tokens on refresh, so it cannot catch this")
	}
}

func mustGet(t testing.TB, s *stack) domain.Token {
	t.Helper()
	tok, err := s.repo.Get(context.Background(), conn)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestUnknownConnection(t *testing.T) {
	w := newWorld(t, time.Hour)
	s := w.stack(t, usecase.Options{})
	if _, err := s.uc.Token(context.Background(), "nobody"); !errors.Is(err, domain.ErrNotFound) {
		t.Errorf("err = %v, want ErrNotFound", err)
	}
}

func TestRevokedGrantMarksNeedsReauthAndStopsCallingProvider(t *testing.T) {
	w := newWorld(t, time.Second)
	s := w.stack(t, usecase.Options{Skew: 500 * time.Millisecond})
	orig := w.connect(t, s)
	w.provider.RevokeAll()
	waitUntilStale(t, s, 500*time.Millisecond)

	_, err := s.uc.Token(context.Background(), conn)
	if !errors.Is(err, domain.ErrNeedsReauth) || !errors.Is(err, domain.ErrGrantRevoked) {
		t.Fatalf("err = %v, want ErrNeedsReauth", err)
	}
	stored := mustGet(t, s)
	if stored.Status != domain.StatusNeedsReauth || stored.StatusReason != "invalid_grant" {
		t.Errorf("status = %s (%s)", stored.Status, stored.StatusReason)
	}
	if !stored.RefreshToken.Equal(orig.RefreshToken) {
		t.Errorf("refresh token not kept for forensics")
	}
	rejected := w.provider.Stats().RefreshRejected
	for range 5 {
		if _, err := s.uc.Token(context.Background(), conn); !errors.Is(err, domain.ErrNeedsReauth) {
			t.Errorf("later call: err = %v", err)
		}
	}
	if got := w.provider.Stats().RefreshRejected; got != rejected {
		t.Errorf("provider called %d more times for a revoked grant", got-rejected)
	}
	// A new grant makes the connection usable again.
	w.connect(t, s)
	if _, err := s.uc.Token(context.Background(), conn); err != nil {
		t.Errorf("after reconnecting: %v", err)
	}
}

func TestProviderFailuresLeaveTokenUntouched(t *testing.T) {
	w := newWorld(t, 2*time.Second)
	s := w.stack(t, usecase.Options{Skew: time.Second, LockWait: 2 * time.Second, RefreshTimeout: 300 * time.Millisecond})
	w.connect(t, s)
	waitUntilStale(t, s, time.Second)
	before := mustGet(t, s)

	// Inside the skew the refresh fails, but the stored token has not
	// expired: it is served.
	w.provider.SetRefreshFault(func() sandbox.Fault { return sandbox.FaultUnavailable })
	if tok, err := s.uc.Token(context.Background(), conn); err != nil || tok.Version != before.Version {
		t.Fatalf("provider down inside the skew: %v (version %d), want the still-valid token", err, tok.Version)
	}
	time.Sleep(time.Until(before.Expiry) + 10*time.Millisecond)

	// Expired: the failures reach the caller, typed. (A hang is a lost
	// answer, awaited past the caller: TestHungProviderAnswerIsAwaitedNotPresentedTwice.)
	for _, f := range []sandbox.Fault{sandbox.FaultUnavailable, sandbox.FaultTooManyRequests} {
		w.provider.SetRefreshFault(func() sandbox.Fault { return f })
		start := time.Now()
		_, err := s.uc.Token(context.Background(), conn)
		if !errors.Is(err, domain.ErrProviderUnavailable) {
			t.Errorf("%v: err = %v, want ErrProviderUnavailable", f, err)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("%v: took %v", f, took)
		}
		if now := mustGet(t, s); now.Version != before.Version || !now.RefreshToken.Equal(before.RefreshToken) {
			t.Errorf("%v: stored token changed after a failed refresh", f)
		}
	}
	w.provider.SetRefreshFault(nil)
	tok, err := s.uc.Token(context.Background(), conn)
	if err != nil || tok.Version != before.Version+1 {
		t.Fatalf("after the provider recovered: %v, version %d", err, tok.Version)
	}
	if w.callResource(t, tok.AccessToken.Reveal()) != http.StatusOK {
		t.Error("refreshed token rejected")
	}
	if st := w.provider.Stats(); st.RefreshReuse != 0 {
		t.Errorf("reuse = %d", st.RefreshReuse)
	}
}

// holdLock keeps the connection's lock from another pool until release.
func holdLock(t *testing.T, s *stack) (release func()) { return holdLockOn(t, s, conn) }

func TestLockWaitBoundAndCancellation(t *testing.T) {
	w := newWorld(t, time.Second)
	holder := w.stack(t, usecase.Options{})
	s := w.stack(t, usecase.Options{Skew: 500 * time.Millisecond, LockWait: 300 * time.Millisecond, RefreshTimeout: 200 * time.Millisecond})
	w.connect(t, s)
	waitUntilStale(t, s, 500*time.Millisecond)
	release := holdLock(t, holder)

	_, err := s.uc.Token(context.Background(), conn)
	if !errors.Is(err, domain.ErrLockTimeout) {
		t.Errorf("err = %v, want ErrLockTimeout", err)
	}

	patient := w.stack(t, usecase.Options{Skew: 500 * time.Millisecond, LockWait: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	_, err = patient.uc.Token(ctx, conn)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("cancelled caller returned after %v", took)
	}
	release()

	sqlDB, _ := patient.db.DB()
	waitfor.Until(t, 5*time.Second, "connections of the cancelled caller still checked out", func() bool { return sqlDB.Stats().InUse == 0 })
	waitfor.Until(t, 5*time.Second, "advisory locks left behind", func() bool { return advisoryLocks(t, holder.db) == 0 })
	if st := w.provider.Stats(); st.Refreshes != 0 {
		t.Errorf("provider refreshed %d times although nobody got the lock", st.Refreshes)
	}
	// With the lock free, the next caller refreshes normally.
	if _, err := s.uc.Token(context.Background(), conn); err != nil {
		t.Errorf("after release: %v", err)
	}
}

func TestDatabaseGone(t *testing.T) {
	w := newWorld(t, time.Hour)
	s := w.stack(t, usecase.Options{})
	w.connect(t, s)
	admin, err := sql.Open("pgx", testdb.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var name string
	if err := s.db.Raw("SELECT current_database()").Scan(&name).Error; err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec("DROP DATABASE " + name + " WITH (FORCE)"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.uc.Token(context.Background(), conn); !errors.Is(err, domain.ErrStoreUnavailable) {
		t.Errorf("err = %v, want ErrStoreUnavailable", err)
	}
}

func TestTokenSourceWorksWithOAuth2Client(t *testing.T) {
	w := newWorld(t, 2*time.Second)
	s := w.stack(t, usecase.Options{Skew: 500 * time.Millisecond})
	w.connect(t, s)
	client := oauth2.NewClient(context.Background(), s.uc.TokenSource(context.Background(), conn))
	deadline := time.Now().Add(3500 * time.Millisecond) // spans at least one expiry
	for time.Now().Before(deadline) {
		resp, err := client.Get(w.srv.URL + "/resource")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st := w.provider.Stats(); st.Refreshes < 1 || st.RefreshReuse != 0 {
		t.Errorf("refreshes=%d reuse=%d", st.Refreshes, st.RefreshReuse)
	}
	src := s.uc.TokenSource(context.Background(), "nobody")
	if _, err := src.Token(); !errors.Is(err, domain.ErrNotFound) {
		t.Errorf("unknown connection: %v", err)
	}
}

func advisoryLocks(t *testing.T, db *gorm.DB) int64 {
	var n int64
	if err := db.Raw(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}
