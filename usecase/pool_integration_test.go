package usecase_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/postgres"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/testworld"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// nestedLease is the rule's breach, for the control: its Claim runs while
// a transaction of its own holds a connection of the same pool (as a lease
// written on a connection of its own, inside the lock's transaction, did).
type nestedLease struct {
	usecase.TokenStore
	pool *gorm.DB
}

func (s nestedLease) Claim(ctx context.Context, seen domain.Token, within time.Duration) (usecase.Claim, error) {
	var c usecase.Claim
	err := s.pool.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec("SELECT 1").Error; err != nil {
			return err
		}
		var err error
		c, err = s.TokenStore.Claim(ctx, seen, within)
		return err
	})
	return c, err
}

// TestPoolOfOneRefreshesManyAtOnce is the rule of docs/design.md ("No
// connection held across the provider call, no nested acquire") put to
// the test: a process whose pool has a single connection refreshes eight
// connections at once at a provider that takes half a second. Every call
// succeeds, each connection is refreshed once. The control breaks the rule
// in one place (a query on the pool while the lock's transaction holds
// the only connection): the holder waits for itself, and calls fail.
func TestPoolOfOneRefreshesManyAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name    string
		control bool
	}{{"rule kept", false}, {"control: nested acquire", true}} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 8
			p, err := sandbox.New(sandbox.Options{AccessTokenLifespan: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			w := testworld.With(t, p)
			admin := w.Stack(t, usecase.Options{})
			names := make([]string, n)
			for i := range names {
				names[i] = fmt.Sprintf("c%d", i)
				tok, err := sandbox.Grant(context.Background(), w.OAuth)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := usecase.NewConnectUseCase(admin.Repo, nil, time.Second).Connect(context.Background(), names[i], provider.GrantFrom(tok)); err != nil {
					t.Fatal(err)
				}
			}
			db, err := postgres.Open(context.Background(), w.URL, postgres.Pool{MaxOpenConns: 1}, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = postgres.Close(db) })
			var store usecase.TokenStore = repository.NewTokenRepository(db, tokencrypt.Plaintext{})
			if tc.control {
				store = nestedLease{store, db}
			}
			clock := &testworld.Clock{}
			clock.Advance(2 * time.Hour) // every token expired
			uc, err := usecase.NewRefreshTokenUseCase(store, provider.Only(provider.NewRefresher(w.OAuth, nil)),
				usecase.Options{Clock: clock, LockWait: 3 * time.Second, RefreshTimeout: 2 * time.Second, WriteTimeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			w.Provider.SetRefreshLatency(500 * time.Millisecond)
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i, name := range names {
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					defer cancel()
					_, errs[i] = uc.Token(ctx, name)
				})
			}
			wg.Wait()
			failed := 0
			for _, err := range errs {
				if err != nil {
					failed++
					t.Logf("call failed: %v", err)
				}
			}
			st := w.Provider.Stats()
			t.Logf("%d of %d failed; provider: %d refreshes, %d reuse", failed, n, st.Refreshes, st.RefreshReuse)
			if tc.control {
				if failed == 0 {
					t.Fatal("control: a nested acquire on a pool of one did not starve the refreshes; the test shows nothing")
				}
				return
			}
			if failed != 0 || st.Refreshes != n || st.RefreshReuse != 0 {
				t.Fatalf("%d failed, %d refreshes, %d reuse; want 0, %d, 0", failed, st.Refreshes, st.RefreshReuse, n)
			}
		})
	}
}
