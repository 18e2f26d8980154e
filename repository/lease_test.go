package repository_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/internal/waitfor"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// lease claims the refresh of tok's version, as a refresh does, and
// returns the lease's end. A claim refused for another holder's lease
// (running or abandoned) is ErrRefreshInProgress; one refused because the
// stored token is not tok any more, ErrConflict.
func lease(t *testing.T, r *repository.TokenRepository, tok domain.Token) (func(bool), error) {
	t.Helper()
	c, err := r.Claim(context.Background(), tok, 0)
	switch {
	case err != nil:
		return nil, err
	case c.End != nil:
		if c.Lease.Running || c.Lease.Abandoned {
			t.Errorf("lease taken over another holder's: %+v", c.Lease)
		}
		return c.End, nil
	case c.Lease.Running || c.Lease.Abandoned:
		return nil, fmt.Errorf("claim of %s at version %d (lease %+v): %w", tok.Connection, tok.Version, c.Lease, domain.ErrRefreshInProgress)
	}
	return nil, fmt.Errorf("claim of %s at version %d found version %d: %w", tok.Connection, tok.Version, c.Token.Version, domain.ErrConflict)
}

func TestLeaseKeepsOthersOutUntilItEnds(t *testing.T) {
	r, _, _ := newRepo(t)
	tok := put(t, r, grantToken("acme", "at-1", "rt-1"))

	end, err := lease(t, r, tok)
	if err != nil {
		t.Fatal(err)
	}
	// The holder is alive and renews: the lease outlasts its first term.
	time.Sleep(3 * leaseTermForTest)
	if _, err := lease(t, r, tok); !errors.Is(err, domain.ErrRefreshInProgress) {
		t.Fatalf("second lease on a renewed one: err = %v, want ErrRefreshInProgress", err)
	}
	end(true) // the token was not spent
	endB, err := lease(t, r, tok)
	if err != nil {
		t.Fatalf("lease after release: %v", err)
	}
	endB(true)
}

// A dead holder's lease runs out into abandoned, never free: its request
// is unresolved, so the version's refresh token is refused to everyone
// until the lost answer is recorded (Fail), which ends the lease.
func TestLeaseOfADeadHolderIsAbandonedNotFree(t *testing.T) {
	r, _, _ := newRepo(t)
	ctx := context.Background()
	tok := put(t, r, grantToken("acme", "at-1", "rt-1"))
	end, err := lease(t, r, tok)
	if err != nil {
		t.Fatal(err)
	}
	end(false) // renewals stop, the record stays: the holder died
	if _, l, err := r.Read(ctx, "acme"); err != nil || !l.Running || l.Abandoned {
		t.Fatalf("while the term runs: %+v, %v; want running", l, err)
	}
	var l usecase.Lease
	waitfor.Until(t, 10*time.Second, "the lease of a holder that stopped renewing never ran out", func() bool {
		_, l, err = r.Read(ctx, "acme")
		return err == nil && l.Abandoned
	})
	if l.Running || l.Age < leaseTermForTest {
		t.Fatalf("abandoned lease: %+v", l)
	}
	if _, err := lease(t, r, tok); !errors.Is(err, domain.ErrRefreshInProgress) {
		t.Fatalf("lease on an abandoned one: err = %v, want ErrRefreshInProgress", err)
	}
	f := domain.RefreshFailure{Failures: 1, Since: time.Now(), LastAt: time.Now(), RetryAt: time.Now().Add(time.Second), Code: domain.CodeAnswerLost}
	if err := r.Fail(ctx, tok, f); err != nil {
		t.Fatal(err)
	}
	if _, l, err := r.Read(ctx, "acme"); err != nil || l != (usecase.Lease{}) {
		t.Fatalf("after the lost answer was recorded: %+v, %v; want no lease", l, err)
	}
	// Claimed as seen with the failure recorded (its backoff is the use
	// case's to honour).
	failed, err := r.Get(ctx, "acme")
	if err != nil || failed.Failure.Failures != 1 {
		t.Fatalf("after the lost answer was recorded: %+v, %v", failed.Failure, err)
	}
	endB, err := lease(t, r, failed)
	if err != nil {
		t.Fatalf("lease after the lost answer was recorded: %v", err)
	}
	endB(true)
}

func TestLeaseOfAnOlderVersionIsNoObstacle(t *testing.T) {
	r, _, _ := newRepo(t)
	tok := put(t, r, grantToken("acme", "at-1", "rt-1"))
	end, err := lease(t, r, tok)
	if err != nil {
		t.Fatal(err)
	}
	defer end(false)
	next := tok
	next.AccessToken, next.RefreshToken = domain.NewSecret("at-2"), domain.NewSecret("rt-2")
	saved, err := r.Store(context.Background(), next)
	if err != nil {
		t.Fatal(err)
	}
	endB, err := lease(t, r, saved)
	if err != nil {
		t.Fatalf("lease on the newer version: %v", err)
	}
	endB(true)
}

// Read reads the token as Get does, and says whether another
// holder's lease on the version read runs: while it runs, and no longer
// once the token was released or a newer version stored (Store ends the
// leases of older versions).
func TestReadSaysWhileALeaseRuns(t *testing.T) {
	r, db, _ := newRepo(t)
	ctx := context.Background()
	tok := put(t, r, grantToken("acme", "at-1", "rt-1"))
	leased := func() bool {
		t.Helper()
		got, leased, err := r.Read(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		want, err := r.Get(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		if got.Version != want.Version || !got.AccessToken.Equal(want.AccessToken) || !got.RefreshToken.Equal(want.RefreshToken) || !got.Expiry.Equal(want.Expiry) {
			t.Fatalf("Read read version %d, Get version %d: not the same token", got.Version, want.Version)
		}
		return leased.Running
	}
	if leased() {
		t.Fatal("a lease is said to run before any was taken")
	}
	end, err := lease(t, r, tok)
	if err != nil {
		t.Fatal(err)
	}
	if !leased() {
		t.Fatal("the lease taken is not seen")
	}
	end(true)
	if leased() {
		t.Fatal("a released lease is still seen")
	}
	end, err = lease(t, r, tok)
	if err != nil {
		t.Fatal(err)
	}
	defer end(false)
	next := tok
	next.AccessToken, next.RefreshToken = domain.NewSecret("at-2"), domain.NewSecret("rt-2")
	if _, err := r.Store(ctx, next); err != nil {
		t.Fatal(err)
	}
	if leased() {
		t.Fatal("a lease on a version no longer stored is seen")
	}
	var leases int
	if err := db.Raw("SELECT count(*) FROM tokenguard_refresh_leases").Scan(&leases).Error; err != nil || leases != 0 {
		t.Fatalf("%d leases left after Store of a newer version (%v), want none", leases, err)
	}
	if _, _, err := r.Read(ctx, "nobody"); !errors.Is(err, domain.ErrNotFound) {
		t.Fatalf("unknown connection: err = %v, want ErrNotFound", err)
	}
}

// leaseTermForTest is longer than a lease's term (repository.leaseTerm).
const leaseTermForTest = time.Second

// A lease taken on another server (a restart, or a standby promoted after
// a failover: a server started at another time), or by a release that did
// not record the server, is not judged by its until, which its holder
// could not extend while the server was away: the first look on this
// server holds it for the grace, for the holder to reconnect and renew it
// or store what it rotated. Then it runs out as any other: abandoned,
// never free.
func TestLeaseFromAnotherServerIsHeldForTheGrace(t *testing.T) {
	for _, tc := range []struct{ name, server string }{
		{"failover", "pg_postmaster_start_time() - interval '3 days'"},
		{"earlier release", "NULL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, db, _ := newRepo(t)
			tok := put(t, r, grantToken("acme", "at-1", "rt-1"))
			end, err := lease(t, r, tok)
			if err != nil {
				t.Fatal(err)
			}
			end(false) // its holder cannot renew it: the server went away
			// Long run out, by the clock of the server it was taken on.
			if err := db.Exec("UPDATE tokenguard_refresh_leases SET until = now() - interval '1 hour', server_started = " + tc.server).Error; err != nil {
				t.Fatal(err)
			}
			if _, err := lease(t, r, tok); !errors.Is(err, domain.ErrRefreshInProgress) {
				t.Fatalf("first look on the new server: err = %v, want ErrRefreshInProgress (held for the grace)", err)
			}
			var left float64
			if err := db.Raw("SELECT extract(epoch FROM until - now()) FROM tokenguard_refresh_leases").Scan(&left).Error; err != nil {
				t.Fatal(err)
			}
			if left < 4 || left > 5.5 {
				t.Fatalf("held for %.1f s, want the grace (5 s)", left)
			}
			// Once the grace is over it runs out like any other.
			if err := db.Exec("UPDATE tokenguard_refresh_leases SET until = now() - interval '1 millisecond'").Error; err != nil {
				t.Fatal(err)
			}
			if _, l, err := r.Read(context.Background(), "acme"); err != nil || !l.Abandoned {
				t.Fatalf("after the grace: %+v, %v; want abandoned", l, err)
			}
			if _, err := lease(t, r, tok); !errors.Is(err, domain.ErrRefreshInProgress) {
				t.Fatalf("after the grace: err = %v, want ErrRefreshInProgress (abandoned, not free)", err)
			}
		})
	}
}

// The Durability's level is set (synchronous_commit) in the transactions
// that commit a lease or a token: a level the server does not know fails
// them (so the setting does reach them), a known one commits as usual.
func TestSyncCommitReachesTheLockTransactions(t *testing.T) {
	r, db, _ := newRepo(t)
	tok := put(t, r, grantToken("acme", "at-1", "rt-1"))
	bad := repository.NewTokenRepository(db, tokencrypt.Plaintext{})
	bad.SetDurability(repository.NewDurabilityUnchecked("everywhere"))
	if _, err := lease(t, bad, tok); !errors.Is(err, domain.ErrStoreUnavailable) {
		t.Fatalf("lease with an unknown level: %v, want the server's refusal", err)
	}
	if _, err := bad.Store(context.Background(), tok); !errors.Is(err, domain.ErrStoreUnavailable) {
		t.Fatalf("store with an unknown level: %v, want the server's refusal", err)
	}
	f := domain.RefreshFailure{Failures: 1, Since: time.Now(), LastAt: time.Now(), Code: domain.CodeAnswerLost}
	if err := bad.Fail(context.Background(), tok, f); !errors.Is(err, domain.ErrStoreUnavailable) {
		t.Fatalf("fail with an unknown level: %v, want the server's refusal", err)
	}
	good := repository.NewTokenRepository(db, tokencrypt.Plaintext{})
	level, err := repository.NewDurability("remote_apply")
	if err != nil {
		t.Fatal(err)
	}
	good.SetDurability(level)
	end, err := lease(t, good, tok)
	if err != nil {
		t.Fatal(err)
	}
	end(false)
	next := tok
	next.AccessToken, next.RefreshToken = domain.NewSecret("at-2"), domain.NewSecret("rt-2")
	if saved, err := good.Store(context.Background(), next); err != nil || saved.Version != tok.Version+1 {
		t.Fatalf("Store = v%d, %v", saved.Version, err)
	}
}
