package usecase_test

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/apiclient"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/testdb"
	"github.com/tokenguard/tokenguard/internal/testworld"
	"github.com/tokenguard/tokenguard/internal/waitfor"
	"github.com/tokenguard/tokenguard/usecase"
)

// These tests run the use case against a real Postgres and the strict
// sandbox provider (fosite: rotation on every refresh, the previous access
// token revoked by a refresh, reuse answered with invalid_grant).

func TestMain(m *testing.M) {
	testdb.Main(m)
}

// conn is the connection testworld.World.Connect grants.
const conn = testworld.Conn

// tokenClients is apiclient.Clients on a use case: the client the apps use, without a *tokenguard.Tokens.
type tokenClients struct{ apiclient.Tokens }

func (c tokenClients) Client(ctx context.Context, connection string) *http.Client {
	return apiclient.NewHTTPClient(ctx, c.Tokens, connection)
}

// waitUntilStale sleeps until the stored token is due for refresh.
func waitUntilStale(t testing.TB, s *testworld.Stack, skew time.Duration) {
	t.Helper()
	tok, err := s.Repo.Get(context.Background(), conn)
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
	w := testworld.New(t, lifespan)
	opts := usecase.Options{Skew: skew, LockWait: 10 * time.Second, RefreshTimeout: 5 * time.Second}
	stacks := make([]*testworld.Stack, processes)
	for i := range stacks {
		stacks[i] = w.Stack(t, opts)
	}
	w.Connect(t, stacks[0])

	// Calls keep flowing from every process between and during the storms,
	// through the client the apps use: a call in flight when another
	// process refreshes meets a 401, which the client recovers.
	var flowCalls, flowFailures atomic.Int64
	stop := make(chan struct{})
	var flow sync.WaitGroup
	for _, s := range stacks {
		client, err := apiclient.New(w.Server.URL, tokenClients{s.UC}, apiclient.Options{})
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
		before := w.Provider.Stats()
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
					tok, err := s.UC.Token(context.Background(), conn)
					r := result{tok: tok, err: err}
					if err == nil {
						r.status = w.CallResource(t, tok.AccessToken.Reveal())
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
		after := w.Provider.Stats()
		refreshes, reuse := after.Refreshes-before.Refreshes, after.RefreshReuse-before.RefreshReuse
		t.Logf("cycle %d: %d callers in %d processes; provider saw %d refresh(es) this expiry, %d reuse; all callers share version %d",
			cycle, n, processes, refreshes, reuse, first.Version)
		if refreshes != 1 || reuse != 0 {
			t.Errorf("cycle %d: provider saw %d refreshes and %d reuses, want exactly 1 and 0", cycle, refreshes, reuse)
		}
	}
	close(stop)
	flow.Wait()
	total := w.Provider.Stats()
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
	w := testworld.New(t, 2*time.Second)
	stacks := []*testworld.Stack{w.Stack(t, usecase.Options{}), w.Stack(t, usecase.Options{}), w.Stack(t, usecase.Options{})}
	w.Connect(t, stacks[0])
	refresher := provider.NewRefresher(w.OAuth, nil)

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
				tok, err := s.Repo.Get(ctx, conn)
				if err != nil {
					t.Error(err)
					return
				}
				g, err := refresher.Refresh(ctx, tok.RefreshToken)
				if err != nil {
					failures.Add(1)
					return
				}
				_ = s.Repo.InLock(ctx, conn, 10*time.Second, time.Second, func(ctx context.Context, l usecase.LockedStore) error {
					_, err := l.Put(ctx, tok.Rotated(g, time.Now()))
					return err
				})
			})
		}
	}
	close(start)
	wg.Wait()
	st := w.Provider.Stats()
	t.Logf("no lock: %d refreshes succeeded, %d reuses detected, %d callers failed", st.Refreshes, st.RefreshReuse, failures.Load())
	if st.RefreshReuse == 0 || failures.Load() == 0 {
		t.Fatalf("the provider did not catch the unlocked race (reuse=%d, failures=%d)", st.RefreshReuse, failures.Load())
	}
	// RFC 9700: the reuse killed the whole grant, so the connection is dead.
	if _, err := refresher.Refresh(context.Background(), stacks[0].MustGet(t).RefreshToken); !errors.Is(err, domain.ErrGrantRevoked) {
		t.Errorf("after reuse the stored refresh token still works: %v", err)
	}
}

func TestControlRefreshOnEveryCallBreaksInFlightCalls(t *testing.T) {
	w := testworld.New(t, time.Hour)
	stacks := []*testworld.Stack{w.Stack(t, usecase.Options{}), w.Stack(t, usecase.Options{}), w.Stack(t, usecase.Options{})}
	w.Connect(t, stacks[0])
	refresher := provider.NewRefresher(w.OAuth, nil)

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
					err := s.Repo.InLock(context.Background(), conn, 20*time.Second, 5*time.Second, func(ctx context.Context, l usecase.LockedStore) error {
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
					if w.CallResource(t, at) == http.StatusUnauthorized {
						unauthorized.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	st := w.Provider.Stats()
	t.Logf("refresh on every call: %d calls, %d answered 401 (provider counted %d), %d reuses", calls.Load(), unauthorized.Load(), st.Resource401, st.RefreshReuse)
	if unauthorized.Load() == 0 {
		t.Fatal("no call failed: the provider does not revoke access tokens on refresh, so it cannot catch this")
	}
}

func TestUnknownConnection(t *testing.T) {
	w := testworld.New(t, time.Hour)
	s := w.Stack(t, usecase.Options{})
	if _, err := s.UC.Token(context.Background(), "nobody"); !errors.Is(err, domain.ErrNotFound) {
		t.Errorf("err = %v, want ErrNotFound", err)
	}
}

func TestRevokedGrantMarksNeedsReauthAndStopsCallingProvider(t *testing.T) {
	w := testworld.New(t, time.Second)
	s := w.Stack(t, usecase.Options{Skew: 500 * time.Millisecond})
	orig := w.Connect(t, s)
	w.Provider.RevokeAll()
	waitUntilStale(t, s, 500*time.Millisecond)

	_, err := s.UC.Token(context.Background(), conn)
	if !errors.Is(err, domain.ErrNeedsReauth) || !errors.Is(err, domain.ErrGrantRevoked) {
		t.Fatalf("err = %v, want ErrNeedsReauth", err)
	}
	stored := s.MustGet(t)
	if stored.Status != domain.StatusNeedsReauth || stored.StatusReason != "invalid_grant" {
		t.Errorf("status = %s (%s)", stored.Status, stored.StatusReason)
	}
	if !stored.RefreshToken.Equal(orig.RefreshToken) {
		t.Errorf("refresh token not kept for forensics")
	}
	rejected := w.Provider.Stats().RefreshRejected
	for range 5 {
		if _, err := s.UC.Token(context.Background(), conn); !errors.Is(err, domain.ErrNeedsReauth) {
			t.Errorf("later call: err = %v", err)
		}
	}
	if got := w.Provider.Stats().RefreshRejected; got != rejected {
		t.Errorf("provider called %d more times for a revoked grant", got-rejected)
	}
	// A new grant makes the connection usable again.
	w.Connect(t, s)
	if _, err := s.UC.Token(context.Background(), conn); err != nil {
		t.Errorf("after reconnecting: %v", err)
	}
}

func TestProviderFailuresLeaveTokenUntouched(t *testing.T) {
	w := testworld.New(t, 2*time.Second)
	clock := &testworld.Clock{}
	s := w.Stack(t, usecase.Options{Skew: time.Second, LockWait: 2 * time.Second, RefreshTimeout: 300 * time.Millisecond, Clock: clock})
	w.Connect(t, s)
	before := s.MustGet(t)
	clock.MoveTo(before.Expiry.Add(-before.EffectiveSkew(time.Second) + 5*time.Millisecond)) // due

	// Inside the skew the refresh fails, but the stored token has not
	// expired: it is served.
	w.Provider.SetRefreshFault(func() sandbox.Fault { return sandbox.FaultUnavailable })
	if tok, err := s.UC.Token(context.Background(), conn); err != nil || tok.Version != before.Version {
		t.Fatalf("provider down inside the skew: %v (version %d), want the still-valid token", err, tok.Version)
	}
	clock.MoveTo(before.Expiry.Add(10 * time.Millisecond))

	// Expired: the failures reach the caller, typed. (A hang is a lost
	// answer, awaited past the caller: TestHungProviderAnswerIsAwaitedNotPresentedTwice.)
	for _, f := range []sandbox.Fault{sandbox.FaultUnavailable, sandbox.FaultTooManyRequests} {
		w.Provider.SetRefreshFault(func() sandbox.Fault { return f })
		start := time.Now()
		_, err := s.UC.Token(context.Background(), conn)
		if !errors.Is(err, domain.ErrProviderUnavailable) {
			t.Errorf("%v: err = %v, want ErrProviderUnavailable", f, err)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("%v: took %v", f, took)
		}
		if now := s.MustGet(t); now.Version != before.Version || !now.RefreshToken.Equal(before.RefreshToken) {
			t.Errorf("%v: stored token changed after a failed refresh", f)
		}
	}
	w.Provider.SetRefreshFault(nil)
	tok, err := s.UC.Token(context.Background(), conn)
	if err != nil || tok.Version != before.Version+1 {
		t.Fatalf("after the provider recovered: %v, version %d", err, tok.Version)
	}
	if w.CallResource(t, tok.AccessToken.Reveal()) != http.StatusOK {
		t.Error("refreshed token rejected")
	}
	if st := w.Provider.Stats(); st.RefreshReuse != 0 {
		t.Errorf("reuse = %d", st.RefreshReuse)
	}
}

// holdLock keeps the connection's lock from another pool until release.
func holdLock(t *testing.T, s *testworld.Stack) (release func()) { return holdLockOn(t, s, conn) }

func TestLockWaitBoundAndCancellation(t *testing.T) {
	w := testworld.New(t, time.Second)
	holder := w.Stack(t, usecase.Options{})
	s := w.Stack(t, usecase.Options{Skew: 500 * time.Millisecond, LockWait: 300 * time.Millisecond, RefreshTimeout: 200 * time.Millisecond})
	w.Connect(t, s)
	waitUntilStale(t, s, 500*time.Millisecond)
	release := holdLock(t, holder)

	_, err := s.UC.Token(context.Background(), conn)
	if !errors.Is(err, domain.ErrLockTimeout) {
		t.Errorf("err = %v, want ErrLockTimeout", err)
	}

	patient := w.Stack(t, usecase.Options{Skew: 500 * time.Millisecond, LockWait: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	_, err = patient.UC.Token(ctx, conn)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("cancelled caller returned after %v", took)
	}
	release()

	sqlDB, _ := patient.DB.DB()
	waitfor.Until(t, 5*time.Second, "connections of the cancelled caller still checked out", func() bool { return sqlDB.Stats().InUse == 0 })
	waitfor.Until(t, 5*time.Second, "advisory locks left behind", func() bool { return advisoryLocks(t, holder.DB) == 0 })
	if st := w.Provider.Stats(); st.Refreshes != 0 {
		t.Errorf("provider refreshed %d times although nobody got the lock", st.Refreshes)
	}
	// With the lock free, the next caller refreshes normally.
	if _, err := s.UC.Token(context.Background(), conn); err != nil {
		t.Errorf("after release: %v", err)
	}
}

func TestDatabaseGone(t *testing.T) {
	w := testworld.New(t, time.Hour)
	s := w.Stack(t, usecase.Options{})
	w.Connect(t, s)
	admin, err := sql.Open("pgx", testdb.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var name string
	if err := s.DB.Raw("SELECT current_database()").Scan(&name).Error; err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec("DROP DATABASE " + name + " WITH (FORCE)"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UC.Token(context.Background(), conn); !errors.Is(err, domain.ErrStoreUnavailable) {
		t.Errorf("err = %v, want ErrStoreUnavailable", err)
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
