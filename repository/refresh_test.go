package repository_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/internal/waitfor"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// leaseRows counts the refresh leases of the test's database.
func leaseRows(t *testing.T, db *gorm.DB) int {
	t.Helper()
	var n int
	if err := db.Raw("SELECT count(*) FROM tokenguard_refresh_leases").Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

// Claim leases only the token its caller saw: the same version, the same
// failure record, active. Otherwise it takes nothing and hands back what
// it re-read under the lock.
func TestClaimLeasesOnlyTheTokenSeen(t *testing.T) {
	r, db, _ := newRepo(t)
	ctx := context.Background()
	seen := put(t, r, grantToken("acme", "at-1", "rt-1"))
	refused := func(what string, seen domain.Token, want func(domain.Token) bool) {
		t.Helper()
		c, err := r.Claim(ctx, seen, time.Second)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if c.End != nil {
			c.End(true)
			t.Fatalf("%s: leased", what)
		}
		if c.Lease.Running || c.Lease.Abandoned {
			t.Errorf("%s: another holder's lease reported: %+v", what, c.Lease)
		}
		if !want(c.Token) {
			t.Errorf("%s: re-read %+v", what, c.Token)
		}
		if n := leaseRows(t, db); n != 0 {
			t.Errorf("%s: %d leases left", what, n)
		}
	}

	// The stored version moved.
	stored, err := r.Store(ctx, seen.Rotated(domain.Grant{AccessToken: domain.NewSecret("at-2"), RefreshToken: domain.NewSecret("rt-2")}, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	refused("an older version", seen, func(got domain.Token) bool {
		return got.Version == stored.Version && got.RefreshToken.Reveal() == "rt-2"
	})

	// A failure was recorded for the version since it was read.
	f := domain.RefreshFailure{Failures: 1, Since: time.Now(), LastAt: time.Now(), RetryAt: time.Now().Add(time.Minute), Code: "temporarily_unavailable"}
	if err := r.Fail(ctx, stored, f); err != nil {
		t.Fatal(err)
	}
	refused("a failure recorded since", stored, func(got domain.Token) bool {
		return got.Version == stored.Version && got.Failure.Failures == 1
	})
	failed, err := r.Get(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	c, err := r.Claim(ctx, failed, time.Second) // the failure seen: leased
	if err != nil || c.End == nil {
		t.Fatalf("claim with the failure seen: lease %t, %v", c.End != nil, err)
	}
	c.End(true)
	if n := leaseRows(t, db); n != 0 {
		t.Fatalf("%d leases left after End(true)", n)
	}

	// Not active.
	dead := failed
	dead.Status, dead.StatusReason = domain.StatusNeedsReauth, "invalid_grant"
	dead, err = r.Store(ctx, dead)
	if err != nil {
		t.Fatal(err)
	}
	refused("a dead grant", dead, func(got domain.Token) bool { return got.Status == domain.StatusNeedsReauth })

	if _, err := r.Claim(ctx, grantToken("nobody", "at", "rt"), time.Second); !errors.Is(err, domain.ErrNotFound) {
		t.Errorf("claim of an unknown connection: %v, want ErrNotFound", err)
	}
}

// Store and Fail are version-fenced: written over another version they
// write nothing and fail with ErrConflict.
func TestStoreAndFailRefuseAnotherVersion(t *testing.T) {
	r, _, _ := newRepo(t)
	ctx := context.Background()
	v1 := put(t, r, grantToken("acme", "at-1", "rt-1"))
	v2, err := r.Store(ctx, v1.Rotated(domain.Grant{AccessToken: domain.NewSecret("at-2"), RefreshToken: domain.NewSecret("rt-2")}, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Store(ctx, v1.Rotated(domain.Grant{AccessToken: domain.NewSecret("at-x"), RefreshToken: domain.NewSecret("rt-x")}, time.Now())); !errors.Is(err, domain.ErrConflict) {
		t.Errorf("store over another version: %v, want ErrConflict", err)
	}
	f := domain.RefreshFailure{Failures: 1, Since: time.Now(), LastAt: time.Now(), Code: "temporarily_unavailable"}
	if err := r.Fail(ctx, v1, f); !errors.Is(err, domain.ErrConflict) {
		t.Errorf("fail of another version: %v, want ErrConflict", err)
	}
	if got, err := r.Get(ctx, "acme"); err != nil || got.Version != v2.Version || got.RefreshToken.Reveal() != "rt-2" || got.Failure.Failures != 0 {
		t.Errorf("after the refused writes: %+v, %v", got, err)
	}
}

// The refresh path's transactions wait for the lock at most until their
// ctx's deadline, and report a wait past it as ErrLockTimeout (not as a
// store that does not answer); nothing is written.
func TestRefreshStepsLockWaitPastCtxIsLockTimeout(t *testing.T) {
	r1, db, url := newRepo(t)
	r2 := repository.NewTokenRepository(open(t, url), tokencrypt.Plaintext{}) // another process
	tok := put(t, r1, grantToken("acme", "at", "rt"))
	release := holdLock(t, r1, "acme", func(context.Context, usecase.LockedStore) error { return nil })
	f := domain.RefreshFailure{Failures: 1, Since: time.Now(), LastAt: time.Now(), Code: "temporarily_unavailable"}
	for name, step := range map[string]func(context.Context) error{
		"Claim": func(ctx context.Context) error { _, err := r2.Claim(ctx, tok, time.Second); return err },
		"Store": func(ctx context.Context) error { _, err := r2.Store(ctx, tok); return err },
		"Fail":  func(ctx context.Context) error { return r2.Fail(ctx, tok, f) },
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		start := time.Now()
		err := step(ctx)
		cancel()
		if !errors.Is(err, domain.ErrLockTimeout) {
			t.Errorf("%s under a held lock: %v, want ErrLockTimeout", name, err)
		}
		if waited := time.Since(start); waited > 2*time.Second {
			t.Errorf("%s waited %v for a 200ms bound", name, waited)
		}
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	if got, err := r1.Get(context.Background(), "acme"); err != nil || got.Version != tok.Version || got.Failure.Failures != 0 {
		t.Errorf("after the timed-out steps: %+v, %v", got, err)
	}
	if n := leaseRows(t, db); n != 0 {
		t.Errorf("%d leases left", n)
	}
	assertNoLocksLeft(t, db)
}

// A claim whose caller gives up while it waits for the lock returns
// promptly and leaves nothing behind: no lease, no lock, no pool
// connection checked out.
func TestClaimGivenUpWhileWaitingLeavesNothing(t *testing.T) {
	r1, db1, url := newRepo(t)
	db2 := open(t, url)
	r2 := repository.NewTokenRepository(db2, tokencrypt.Plaintext{})
	tok := put(t, r1, grantToken("acme", "at", "rt"))
	release := holdLock(t, r1, "acme", func(context.Context, usecase.LockedStore) error { return nil })

	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(150*time.Millisecond, cancel)
	start := time.Now()
	c, err := r2.Claim(ctx, tok, time.Second)
	if !errors.Is(err, context.Canceled) || c.End != nil {
		t.Fatalf("claim given up: lease %t, err = %v, want context.Canceled and no lease", c.End != nil, err)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Errorf("cancelled claim returned after %v", waited)
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	sqlDB, _ := db2.DB()
	waitfor.Until(t, 5*time.Second, "pool connections still in use", func() bool { return sqlDB.Stats().InUse == 0 })
	assertNoLocksLeft(t, db1)
	if n := leaseRows(t, db1); n != 0 {
		t.Errorf("%d leases left by the claim given up", n)
	}
	// The connection is free for the next claim.
	c, err = r2.Claim(context.Background(), tok, time.Second)
	if err != nil || c.End == nil {
		t.Fatalf("next claim: lease %t, %v", c.End != nil, err)
	}
	c.End(true)
}

// A claim of a token that cannot be opened (its ciphertext altered, its
// key gone) fails with domain.ErrUndecryptable and takes no lease: the
// lease and the read commit together, or not at all.
func TestClaimOfAnUndecryptableTokenTakesNoLease(t *testing.T) {
	_, db, _ := newRepo(t)
	ctx := context.Background()
	k1 := repository.NewTokenRepository(db, keyring(t, "k1="+testKey1))
	tok := put(t, k1, grantToken("acme", "at", "rt"))
	if err := db.Exec(`UPDATE tokenguard_tokens SET access_token = refresh_token`).Error; err != nil {
		t.Fatal(err)
	}
	c, err := k1.Claim(ctx, tok, time.Second)
	if !errors.Is(err, domain.ErrUndecryptable) || c.End != nil {
		t.Fatalf("claim of an altered row: %v (taken: %t), want ErrUndecryptable", err, c.End != nil)
	}
	if n := leaseRows(t, db); n != 0 {
		t.Errorf("%d leases left by a claim that failed", n)
	}
}
