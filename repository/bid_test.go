package repository_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// claimBid tries tok's lock with a bid for tok's version and asks for the
// lease, as a refresh does; lease false: the caller's fn does not ask for
// it.
func claimBid(t *testing.T, r *repository.TokenRepository, tok domain.Token, lease bool) (bool, func(bool), error) {
	t.Helper()
	var end func(bool)
	locked, err := r.ClaimInLock(context.Background(), tok.Connection, time.Second, usecase.LeaseBid{Version: tok.Version},
		func(ctx context.Context, l usecase.LockedStore) error {
			got, err := l.Get(ctx, tok.Connection)
			if err != nil {
				return err
			}
			if got.Version != tok.Version || !lease {
				return nil
			}
			end, err = l.Lease(ctx, got, 0)
			return err
		})
	return locked, end, err
}

// A bid takes the lease in the lock's round trip, only for the version
// bid, only under the lock, and never over another holder's lease; a
// lease its caller did not ask for is released.
func TestLeaseBid(t *testing.T) {
	r, _, _ := newRepo(t)
	tok := put(t, r, grantToken("acme", "at-1", "rt-1"))
	ok := func() {
		t.Helper()
		locked, end, err := claimBid(t, r, tok, true)
		if err != nil || !locked || end == nil {
			t.Fatalf("bid: locked %v, lease %v, err %v; want the lease", locked, end != nil, err)
		}
		end(true)
	}
	ok()

	// Another holder's lease runs: the bid is refused as such.
	end, err := lease(t, r, tok)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := claimBid(t, r, tok, true); !errors.Is(err, domain.ErrRefreshInProgress) {
		t.Fatalf("bid over a running lease: err = %v, want ErrRefreshInProgress", err)
	}
	end(true)

	// The lock is held by another transaction: the try fails and takes
	// nothing, even though the lease is free.
	release := make(chan struct{})
	holding := make(chan struct{})
	let := make(chan struct{})
	go func() {
		defer close(let)
		_ = r.InLock(context.Background(), tok.Connection, time.Second, 5*time.Second, func(context.Context, usecase.LockedStore) error {
			close(holding)
			<-release
			return nil
		})
	}()
	<-holding
	locked, end, err := claimBid(t, r, tok, true)
	close(release)
	<-let // the other transaction has ended
	if locked || end != nil || err != nil {
		t.Fatalf("bid while the lock is held: locked %v, lease %v, err %v; want neither", locked, end != nil, err)
	}

	// A bid whose caller does not ask for the lease leaves it free.
	if _, _, err := claimBid(t, r, tok, false); err != nil {
		t.Fatal(err)
	}
	ok()

	// The stored version moved: the bid is missed, nothing is taken.
	stale := tok
	stored := put(t, r, grantToken("acme", "at-2", "rt-2"))
	if stored.Version == stale.Version {
		t.Fatalf("put kept version %d", stored.Version)
	}
	var endStale func(bool)
	_, err = r.ClaimInLock(context.Background(), "acme", time.Second, usecase.LeaseBid{Version: stale.Version},
		func(ctx context.Context, l usecase.LockedStore) error {
			var err error
			endStale, err = l.Lease(ctx, stale, 0)
			return err
		})
	pipelined, perr := r.Pipelined(context.Background())
	switch {
	case perr != nil:
		t.Fatal(perr)
	case !pipelined: // the GORM path ignores bids: Lease leases
		if err != nil {
			t.Fatal(err)
		}
		endStale(true)
	case !errors.Is(err, usecase.ErrBidMissed):
		t.Fatalf("bid for an old version: err = %v, want ErrBidMissed", err)
	}
	tok = stored
	ok()
}
