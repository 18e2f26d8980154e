package usecase_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/postgres"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/testworld"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// announcing is the real refresher, except that it says when a call has
// gone out to the provider.
type announcing struct {
	next   provider.GrantRefresher
	called chan struct{}
}

func (a *announcing) Refresh(ctx context.Context, rt domain.Secret) (domain.Grant, error) {
	select {
	case a.called <- struct{}{}:
	default:
	}
	return a.next.Refresh(ctx, rt)
}

// withoutLeases is a token store whose claims ignore other holders'
// refresh leases: the strategy before them, for the controls.
type withoutLeases struct{ usecase.TokenStore }

// Read never reports a lease.
func (s withoutLeases) Read(ctx context.Context, connection string) (domain.Token, usecase.Lease, error) {
	t, _, err := s.TokenStore.Read(ctx, connection)
	return t, usecase.Lease{}, err
}

// Claim takes what another holder's lease refused.
func (s withoutLeases) Claim(ctx context.Context, seen domain.Token, within time.Duration) (usecase.Claim, error) {
	c, err := s.TokenStore.Claim(ctx, seen, within)
	if err == nil && c.End == nil && (c.Lease.Running || c.Lease.Abandoned) {
		c.Lease, c.End = usecase.Lease{}, func(bool) {}
	}
	return c, err
}

// lockCounting counts the lock transactions run through it.
type lockCounting struct {
	usecase.TokenStore
	n atomic.Int64
}

func (s *lockCounting) Claim(ctx context.Context, seen domain.Token, within time.Duration) (usecase.Claim, error) {
	s.n.Add(1)
	return s.TokenStore.Claim(ctx, seen, within)
}

func (s *lockCounting) Store(ctx context.Context, t domain.Token) (domain.Token, error) {
	s.n.Add(1)
	return s.TokenStore.Store(ctx, t)
}

func (s *lockCounting) Fail(ctx context.Context, t domain.Token, f domain.RefreshFailure) error {
	s.n.Add(1)
	return s.TokenStore.Fail(ctx, t, f)
}

// TestLeaseWhileAtTheProvider: a process's refresh is at a slow provider,
// holding no database connection and no lock (only its lease), when
// another process needs the same connection. With leases, the second
// process waits for the first, whose rotated token it then serves; the
// provider sees one refresh and no reuse. The control runs the second
// process without leases against the same strict provider: it presents
// the refresh token the first one is spending, the provider sees a reuse
// and revokes the grant.
func TestLeaseWhileAtTheProvider(t *testing.T) {
	for _, tc := range []struct {
		name    string
		control bool
	}{{"lease", false}, {"control without leases", true}} {
		t.Run(tc.name, func(t *testing.T) {
			w := testworld.New(t, 4*time.Second)
			admin := w.Stack(t, usecase.Options{})
			w.Connect(t, admin)
			stored := admin.MustGet(t)
			opts := usecase.Options{Skew: time.Second, LockWait: 5 * time.Second, RefreshTimeout: 3 * time.Second,
				RescueWindow: 5 * time.Second}
			waitUntilStale(t, admin, opts.Skew)

			first := &announcing{next: provider.NewRefresher(w.OAuth, nil), called: make(chan struct{}, 1)}
			a := w.StackWith(t, first, opts)
			w.Provider.SetRefreshLatency(time.Second)

			type result struct {
				tok domain.Token
				err error
			}
			aDone := make(chan result, 1)
			go func() {
				tok, err := a.UC.Token(context.Background(), conn)
				aDone <- result{tok, err}
			}()
			<-first.called
			// While the provider answers, the first process holds no lock
			// and no transaction.
			var held int64
			if err := admin.DB.Raw(`SELECT (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
				AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))
				+ (SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%')`).Scan(&held).Error; err != nil {
				t.Fatal(err)
			}
			if held != 0 {
				t.Fatalf("%d advisory locks or open transactions while the provider answers, want none", held)
			}

			// The second process: the lock is free, the stored token is
			// still the one being spent.
			db, err := postgres.Open(context.Background(), w.URL, postgres.Pool{MaxOpenConns: 10}, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = postgres.Close(db) })
			locks := &lockCounting{TokenStore: repository.NewTokenRepository(db, tokencrypt.Plaintext{})}
			var store usecase.TokenStore = locks
			if tc.control {
				store = withoutLeases{store}
			}
			b, err := usecase.NewRefreshTokenUseCase(store, provider.Only(provider.NewRefresher(w.OAuth, nil)), opts)
			if err != nil {
				t.Fatal(err)
			}
			bTok, bErr := b.Token(context.Background(), conn)
			ra := <-aDone
			w.Provider.SetRefreshLatency(0)
			st := w.Provider.Stats()
			now := admin.MustGet(t)
			t.Logf("first: err=%v; second: err=%v; provider: %d refreshes, %d reuse; stored: version %d, %s",
				ra.err, bErr, st.Refreshes, st.RefreshReuse, now.Version, now.Status)

			if tc.control {
				if st.RefreshReuse == 0 {
					t.Fatal("control: the second process did not reuse the refresh token; the test shows nothing")
				}
				return
			}
			if ra.err != nil || bErr != nil {
				t.Fatalf("first: %v, second: %v", ra.err, bErr)
			}
			if st.RefreshReuse != 0 || st.Refreshes != 1 {
				t.Fatalf("provider saw %d refreshes and %d reuse, want 1 and 0", st.Refreshes, st.RefreshReuse)
			}
			if now.Status != domain.StatusActive || now.Version != stored.Version+1 ||
				!bTok.AccessToken.Equal(now.AccessToken) || !ra.tok.AccessToken.Equal(now.AccessToken) {
				t.Fatalf("stored version %d (%s), want %d active and served by both", now.Version, now.Status, stored.Version+1)
			}
			// Its read saw the lease: it waited for the refresh without
			// taking the lock (or a pool connection) to be told so.
			if n := locks.n.Load(); n != 0 {
				t.Errorf("the second process ran %d lock transactions while the first one's lease ran, want 0", n)
			}
			if code := w.CallResource(t, bTok.AccessToken.Reveal()); code != 200 {
				t.Errorf("the token both processes hold answered %d", code)
			}
			// The connection lives on: the next refresh redeems the rescued
			// refresh token.
			if _, err := b.Token(context.Background(), conn); err != nil {
				t.Errorf("next refresh: %v", err)
			}
			if st := w.Provider.Stats(); st.RefreshReuse != 0 {
				t.Errorf("reuse after the rescue: %d", st.RefreshReuse)
			}
		})
	}
}

// TestLeaseEndsWhenTheTokenWasNotSpent: a refresh that failed without
// spending the refresh token (the provider answered 503) releases its
// lease, so the next process refreshes at once instead of waiting the
// lease out.
func TestLeaseEndsWhenTheTokenWasNotSpent(t *testing.T) {
	w := testworld.New(t, 2*time.Second)
	admin := w.Stack(t, usecase.Options{})
	w.Connect(t, admin)
	opts := usecase.Options{Skew: 500 * time.Millisecond, LockWait: 2 * time.Second, RefreshTimeout: time.Second}
	waitUntilStale(t, admin, opts.Skew)
	a := w.Stack(t, opts)
	w.Provider.SetRefreshFault(func() sandbox.Fault { return sandbox.FaultUnavailable })
	// The token is due but not expired: it is served through the failure.
	if _, err := a.UC.Token(context.Background(), conn); err != nil {
		t.Fatalf("Token during the outage: %v", err)
	}
	w.Provider.SetRefreshFault(nil)
	if st := w.Provider.Stats(); st.RefreshFaults == 0 {
		t.Fatal("the provider was not asked")
	}
	var leases int64
	if err := admin.DB.Raw(`SELECT count(*) FROM tokenguard_refresh_leases`).Scan(&leases).Error; err != nil {
		t.Fatal(err)
	}
	if leases != 0 {
		t.Fatalf("%d leases left by a refresh that spent nothing", leases)
	}
	b := w.Stack(t, opts)
	if _, err := b.UC.Token(context.Background(), conn); err != nil {
		t.Fatalf("next process: %v", err)
	}
	if st := w.Provider.Stats(); st.Refreshes != 1 {
		t.Fatalf("the next process made %d refreshes, want 1 at once", st.Refreshes)
	}
}
