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
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		var waiting int
		if err := db.Raw(advisoryLocks + " AND NOT granted").Scan(&waiting).Error; err != nil {
			t.Fatal(err)
		}
		if waiting == n {
			return
		}
	}
	t.Fatalf("never saw %d lock waiters", n)
}

// rotate stores a rotated token for name, as a refresh does.
func rotate(name string) func(context.Context, usecase.LockedStore) error {
	return func(ctx context.Context, l usecase.LockedStore) error {
		cur, err := l.Get(ctx, name)
		if err != nil {
			return err
		}
		next := cur.Rotated(domain.Grant{AccessToken: domain.NewSecret("at2"), RefreshToken: domain.NewSecret("rt2"),
			Expiry: time.Now().Add(time.Hour)}, time.Now())
		_, err = l.Save(ctx, next)
		return err
	}
}

// The read that comes back with the lock (in the same round trip) must be
// taken after the lock was granted: it sees what the holder committed.
func TestInLockReadsWhatTheHolderCommitted(t *testing.T) {
	r1, db, url := newRepo(t)
	r2 := repository.NewTokenRepository(open(t, url), tokencrypt.Plaintext{})
	v1 := put(t, r1, grantToken("acme", "at", "rt"))

	release := holdLock(t, r1, "acme", rotate("acme"))
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
		cur, err := l.Get(ctx, "acme")
		if err != nil {
			return err
		}
		cur.Status = "no such status" // violates a CHECK constraint
		if _, err := l.Save(ctx, cur); err == nil {
			t.Error("the schema took an unknown status")
		}
		return nil
	})
	if !errors.Is(err, domain.ErrStoreUnavailable) || !strings.Contains(err.Error(), "rolled back") {
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
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var n int
		if err := db.Raw(advisoryLocks).Scan(&n).Error; err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the panicking transaction still holds the lock")
		}
	}
	if err := r.InLock(context.Background(), "acme", time.Second, time.Second, func(context.Context, usecase.LockedStore) error { return nil }); err != nil {
		t.Fatal(err)
	}
}

func TestInLockRefusesARepositoryBoundToATransaction(t *testing.T) {
	_, db, _ := newRepo(t)
	tx := db.Begin()
	defer tx.Rollback()
	err := repository.NewTokenRepository(tx, tokencrypt.Plaintext{}).InLock(context.Background(), "acme", time.Second, time.Second,
		func(context.Context, usecase.LockedStore) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "not to a connection pool") {
		t.Fatalf("err = %v, want a refusal", err)
	}
}

// assertNoLocksLeft waits a little for the locks and the connections
// to be given back, within rollbackTimeout.
func assertNoLocksLeft(t *testing.T, dbs ...*gorm.DB) {
	t.Helper()
	var locks, inUse int
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
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
		if locks == 0 && inUse == 0 || time.Now().After(deadline) {
			break
		}
	}
	if locks != 0 {
		t.Errorf("%d advisory locks left", locks)
	}
	if inUse != 0 {
		t.Errorf("%d pool connections still checked out", inUse)
	}
}

// docs/operations.md tells PgBouncer users without prepared-statement
// support to switch pgx to the exec or simple protocol: the pipelined lock
// transaction must work in every mode, the re-read and the lease included.
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
			name := "acme-" + strings.ReplaceAll(mode, "_", "-")
			v1 := put(t, r, grantToken(name, "at", "rt"))
			release := holdLock(t, r, name, rotate(name))
			got := make(chan domain.Token, 1)
			errc := make(chan error, 1)
			go func() {
				var tok domain.Token
				err := r.InLock(context.Background(), name, 5*time.Second, time.Second, func(ctx context.Context, l usecase.LockedStore) error {
					var err error
					if tok, err = l.Get(ctx, name); err != nil {
						return err
					}
					end, err := l.Lease(ctx, tok, time.Second)
					if err == nil {
						end(true)
					}
					return err
				})
				got <- tok
				errc <- err
			}()
			waitForLockWaiters(t, db, 1)
			if err := release(); err != nil {
				t.Fatal(err)
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			if tok := <-got; tok.Version != v1.Version+1 {
				t.Fatalf("waiter read version %d, want the holder's %d", tok.Version, v1.Version+1)
			}
			assertNoLocksLeft(t, db)
		})
	}
}

// A lock transaction's statements are planned generically from their first
// run on a connection (beginLockTx): pg_prepared_statements, on the pool's
// one connection, counts the custom plans of the token write and of the
// lock's read after a few refreshes' worth of them. Without the setting,
// Postgres makes a custom plan at each of the first five runs.
func TestLockTransactionsPlanGenerically(t *testing.T) {
	r, db, _ := newRepo(t)
	if pipelined, err := r.Pipelined(context.Background()); err != nil || !pipelined {
		t.Skipf("the lock transactions are GORM's on this driver, which prepares nothing (pipelined %t, %v)", pipelined, err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	sqlDB.SetMaxOpenConns(1) // one backend: its prepared statements are the ones counted
	tok := put(t, r, grantToken("acme", "at-1", "rt-1"))
	for i := range 3 {
		end, err := lease(t, r, tok)
		if err != nil {
			t.Fatal(err)
		}
		end(false)
		next := tok
		next.AccessToken, next.RefreshToken = domain.NewSecret(fmt.Sprintf("at-%d", i+2)), domain.NewSecret(fmt.Sprintf("rt-%d", i+2))
		if tok, err = r.SaveLocked(context.Background(), time.Second, next); err != nil {
			t.Fatal(err)
		}
	}
	var plans []struct {
		SQL                       string
		GenericPlans, CustomPlans int64
	}
	err = db.Raw(`SELECT statement AS sql, generic_plans, custom_plans FROM pg_prepared_statements
		WHERE (strpos(statement, 'UPDATE tokenguard_tokens AS t SET') > 0 OR strpos(statement, 'SELECT pg_advisory_xact_lock') > 0)
		AND strpos(statement, 'pg_prepared_statements') = 0`).Scan(&plans).Error
	if err != nil {
		t.Fatal(err)
	}
	if len(plans) < 2 {
		t.Fatalf("%d of the write and the lock among the connection's prepared statements, want both", len(plans))
	}
	for _, p := range plans {
		if p.CustomPlans != 0 || p.GenericPlans < 3 {
			t.Errorf("%d custom and %d generic plans, want 0 and at least 3, of\n%s", p.CustomPlans, p.GenericPlans, p.SQL)
		}
	}
}
