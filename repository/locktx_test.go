package repository_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/internal/waitfor"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// holdLock holds name's lock in r until release is called, then runs then
// (a write, or nothing) and commits. It returns when the lock is held.
func holdLock(t *testing.T, r *repository.TokenRepository, name string, then func(context.Context, usecase.LockedStore) error) (release func() error) {
	t.Helper()
	held := make(chan struct{})
	rel := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- r.InLock(context.Background(), name, time.Second, 10*time.Second, func(ctx context.Context, l usecase.LockedStore) error {
			close(held)
			<-rel
			return then(ctx, l)
		})
	}()
	select {
	case <-held:
	case err := <-done:
		t.Fatal(err)
	}
	return func() error { close(rel); return <-done }
}

// advisoryLocks counts the advisory locks of this test's database: the
// server is shared with the tests of other packages, running meanwhile.
const (
	advisoryLocksFrom = " FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
	advisoryLocks     = "SELECT count(*)" + advisoryLocksFrom
)

// waitForLockWaiters waits until n transactions wait for an advisory lock.
func waitForLockWaiters(t *testing.T, db *gorm.DB, n int) {
	t.Helper()
	waitfor.Until(t, 5*time.Second, fmt.Sprintf("never saw %d lock waiters", n), func() bool {
		var waiting int
		if err := db.Raw(advisoryLocks + " AND NOT granted").Scan(&waiting).Error; err != nil {
			t.Fatal(err)
		}
		return waiting == n
	})
}

// regrant stores a new grant for name under the held lock (Put: the one
// write of a LockedStore), committed with the transaction.
func regrant(name string) func(context.Context, usecase.LockedStore) error {
	return func(ctx context.Context, l usecase.LockedStore) error {
		_, err := l.Put(ctx, grantToken(name, "at2", "rt2"))
		return err
	}
}

// The read under the lock is taken after the lock was granted: it sees
// what the holder committed.
func TestInLockReadsWhatTheHolderCommitted(t *testing.T) {
	r1, db, url := newRepo(t)
	r2 := repository.NewTokenRepository(open(t, url), tokencrypt.Plaintext{})
	v1 := put(t, r1, grantToken("acme", "at", "rt"))

	release := holdLock(t, r1, "acme", regrant("acme"))
	got := make(chan domain.Token, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- r2.InLock(context.Background(), "acme", 5*time.Second, time.Second, func(ctx context.Context, l usecase.LockedStore) error {
			tok, err := l.Get(ctx, "acme")
			got <- tok
			return err
		})
	}()
	waitForLockWaiters(t, db, 1)
	if err := release(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if tok := <-got; tok.Version != v1.Version+1 || tok.AccessToken.Reveal() != "at2" {
		t.Fatalf("read under the lock: version %d, want %d (the holder's write)", tok.Version, v1.Version+1)
	}
}

// A statement that failed inside fn aborts the transaction; if fn swallows
// the error, the commit must not pass for a success (Postgres answers
// COMMIT with ROLLBACK), and the connection goes back clean.
func TestInLockReportsACommitThatRolledBack(t *testing.T) {
	r, db, _ := newRepo(t)
	put(t, r, grantToken("acme", "at", "rt"))
	err := r.InLock(context.Background(), "acme", time.Second, time.Second, func(ctx context.Context, l usecase.LockedStore) error {
		cur := grantToken("acme", "at-2", "rt-2")
		cur.Provider = "nobody" // violates a foreign key
		if _, err := l.Put(ctx, cur); err == nil {
			t.Error("the schema took an unknown provider")
		}
		return nil
	})
	if !errors.Is(err, domain.ErrStoreUnavailable) || !strings.Contains(err.Error(), "rollback") {
		t.Fatalf("err = %v, want a commit that rolled back", err)
	}
	assertNoLocksLeft(t, db)
	if _, err := r.Get(context.Background(), "acme"); err != nil {
		t.Fatal(err)
	}
}

func TestInLockPanicClosesTheConnection(t *testing.T) {
	r, db, _ := newRepo(t)
	put(t, r, grantToken("acme", "at", "rt"))
	func() {
		defer func() { _ = recover() }()
		_ = r.InLock(context.Background(), "acme", time.Second, time.Second, func(context.Context, usecase.LockedStore) error {
			panic("boom")
		})
	}()
	// The server rolled the transaction back when its connection closed.
	waitfor.Until(t, 5*time.Second, "the panicking transaction still holds the lock", func() bool {
		var n int
		if err := db.Raw(advisoryLocks).Scan(&n).Error; err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	if err := r.InLock(context.Background(), "acme", time.Second, time.Second, func(context.Context, usecase.LockedStore) error { return nil }); err != nil {
		t.Fatal(err)
	}
}

// A repository bound to a transaction, not to a pool, is refused: its
// locked transactions would run inside the caller's, holding the lock and
// keeping their writes (a lease, a token) uncommitted until the caller's
// transaction ends.
func TestInLockRefusesARepositoryBoundToATransaction(t *testing.T) {
	r, db, _ := newRepo(t)
	put(t, r, grantToken("acme", "at", "rt"))
	tx := db.Begin()
	defer tx.Rollback()
	err := repository.NewTokenRepository(tx, tokencrypt.Plaintext{}).InLock(context.Background(), "acme", time.Second, time.Second,
		func(context.Context, usecase.LockedStore) error { return nil })
	if err == nil {
		var held int
		tx.Raw(advisoryLocks + " AND granted").Scan(&held)
		t.Fatalf("InLock ran in the caller's transaction (%d advisory locks still held after it returned), want a refusal", held)
	}
}

// assertNoLocksLeft waits a little for the locks and the connections
// to be given back, within rollbackTimeout.
func assertNoLocksLeft(t *testing.T, dbs ...*gorm.DB) {
	t.Helper()
	var locks, inUse int
	// What was left at the last look, when the wait fails.
	defer func() {
		if locks != 0 {
			t.Errorf("%d advisory locks left", locks)
		}
		if inUse != 0 {
			t.Errorf("%d pool connections still checked out", inUse)
		}
	}()
	waitfor.Until(t, 5*time.Second, "advisory locks or pool connections not given back", func() bool {
		if err := dbs[0].Raw(advisoryLocks).Scan(&locks).Error; err != nil {
			t.Fatal(err)
		}
		inUse = 0
		for _, db := range dbs {
			sqlDB, err := db.DB()
			if err != nil {
				t.Fatal(err)
			}
			inUse += sqlDB.Stats().InUse
		}
		return locks == 0 && inUse == 0
	})
}

// docs/operations.md tells PgBouncer users without prepared-statement
// support to switch pgx to the exec or simple protocol: the lock
// transactions must work in every mode, the re-read under the lock, the
// lease, the write and the failure record included.
func TestLockTransactionInEveryQueryExecMode(t *testing.T) {
	_, _, url := newRepo(t)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			db := open(t, url+sep+"default_query_exec_mode="+mode)
			r := repository.NewTokenRepository(db, tokencrypt.Plaintext{})
			ctx := context.Background()
			name := "acme-" + strings.ReplaceAll(mode, "_", "-")
			v1 := put(t, r, grantToken(name, "at", "rt"))
			release := holdLock(t, r, name, regrant(name))
			type claimed struct {
				c   usecase.Claim
				err error
			}
			got := make(chan claimed, 1)
			go func() {
				c, err := r.Claim(ctx, v1, time.Second)
				got <- claimed{c, err}
			}()
			waitForLockWaiters(t, db, 1)
			if err := release(); err != nil {
				t.Fatal(err)
			}
			c := <-got
			if c.err != nil {
				t.Fatal(c.err)
			}
			if c.c.Token.Version != v1.Version+1 || c.c.End != nil {
				t.Fatalf("waiter's claim read version %d (lease %t), want the holder's %d and no lease", c.c.Token.Version, c.c.End != nil, v1.Version+1)
			}
			v2 := c.c.Token
			cl, err := r.Claim(ctx, v2, time.Second)
			if err != nil || cl.End == nil {
				t.Fatalf("claim of the stored version: lease %t, %v", cl.End != nil, err)
			}
			if _, l, err := r.Read(ctx, name); err != nil || !l.Running {
				t.Fatalf("Read after the claim: %+v, %v; want the lease running", l, err)
			}
			f := domain.RefreshFailure{Failures: 1, Since: time.Now(), LastAt: time.Now(), RetryAt: time.Now().Add(time.Minute), Code: "temporarily_unavailable"}
			if err := r.Fail(ctx, v2, f); err != nil {
				t.Fatal(err)
			}
			cl.End(false)
			if cur, err := r.Get(ctx, name); err != nil || cur.Failure.Failures != 1 {
				t.Fatalf("after Fail: %+v, %v", cur.Failure, err)
			}
			next := v2.Rotated(domain.Grant{AccessToken: domain.NewSecret("at3"), RefreshToken: domain.NewSecret("rt3"), Expiry: time.Now().Add(time.Hour)}, time.Now())
			if stored, err := r.Store(ctx, next); err != nil || stored.Version != v2.Version+1 || stored.RefreshToken.Reveal() != "rt3" {
				t.Fatalf("Store = v%d %q, %v", stored.Version, stored.RefreshToken.Reveal(), err)
			}
			assertNoLocksLeft(t, db)
		})
	}
}
