package repository_test

import (
	"context"
	"errors"
	"strings"
	"sync"
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

func TestInLockUnlessWaitersWakeTogetherAndSkipSettledWork(t *testing.T) {
	r1, db, url := newRepo(t)
	v1 := put(t, r1, grantToken("acme", "at", "rt"))
	release := holdLock(t, r1, "acme", rotate("acme"))

	const waiters = 3
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ran int
	got := make([]domain.Token, waiters)
	done := make([]bool, waiters)
	errs := make([]error, waiters)
	pools := []*gorm.DB{db}
	for i := range waiters {
		pool := open(t, url) // a process each
		pools = append(pools, pool)
		r := repository.NewTokenRepository(pool, tokencrypt.Plaintext{})
		wg.Go(func() {
			got[i], done[i], errs[i] = r.InLockUnless(context.Background(), "acme", 5*time.Second, time.Second,
				func(t domain.Token) bool { return t.Version > v1.Version },
				func(context.Context, usecase.LockedStore) error { mu.Lock(); ran++; mu.Unlock(); return nil })
		})
	}
	// All of them wait at once, in shared mode: none queues behind another.
	waitForLockWaiters(t, db, waiters)
	var modes []string
	if err := db.Raw("SELECT mode" + advisoryLocksFrom + " AND NOT granted").Scan(&modes).Error; err != nil {
		t.Fatal(err)
	}
	for _, m := range modes {
		if m != "ShareLock" {
			t.Errorf("waiter in %s, want ShareLock", m)
		}
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i := range waiters {
		if errs[i] != nil || !done[i] || got[i].Version != v1.Version+1 || got[i].AccessToken.Reveal() != "at2" {
			t.Errorf("waiter %d: done=%v version=%d err=%v, want the holder's token", i, done[i], got[i].Version, errs[i])
		}
	}
	if ran != 0 {
		t.Errorf("fn ran %d times although the holder did the work", ran)
	}
	assertNoLocksLeft(t, pools...)
}

// A holder that leaves the work undone (it failed, or its process died)
// does not strand the waiters: one of them takes the lock and does it.
func TestInLockUnlessDoesTheWorkWhenTheHolderDidNot(t *testing.T) {
	r1, db, url := newRepo(t)
	v1 := put(t, r1, grantToken("acme", "at", "rt"))
	release := holdLock(t, r1, "acme", func(context.Context, usecase.LockedStore) error { return errors.New("provider down") })

	const waiters = 3
	var wg sync.WaitGroup
	errs := make([]error, waiters)
	for i := range waiters {
		r := repository.NewTokenRepository(open(t, url), tokencrypt.Plaintext{})
		wg.Go(func() {
			_, _, errs[i] = r.InLockUnless(context.Background(), "acme", 5*time.Second, time.Second,
				func(t domain.Token) bool { return t.Version > v1.Version },
				func(ctx context.Context, l usecase.LockedStore) error {
					cur, err := l.Get(ctx, "acme")
					if err != nil || cur.Version > v1.Version {
						return err // a previous waiter did it
					}
					return rotate("acme")(ctx, l)
				})
		})
	}
	waitForLockWaiters(t, db, waiters)
	if err := release(); err == nil || !strings.Contains(err.Error(), "provider down") {
		t.Fatalf("holder: %v", err)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("waiter %d: %v", i, err)
		}
	}
	if tok, err := r1.Get(context.Background(), "acme"); err != nil || tok.Version != v1.Version+1 {
		t.Fatalf("after the waiters: version %d (%v), want exactly one rotation", tok.Version, err)
	}
	assertNoLocksLeft(t, db)
}

func TestInLockUnlessBoundsTheWait(t *testing.T) {
	r1, _, url := newRepo(t)
	put(t, r1, grantToken("acme", "at", "rt"))
	r2 := repository.NewTokenRepository(open(t, url), tokencrypt.Plaintext{})
	release := holdLock(t, r1, "acme", func(context.Context, usecase.LockedStore) error { return nil })
	defer func() { _ = release() }()
	_, _, err := r2.InLockUnless(context.Background(), "acme", 200*time.Millisecond, time.Second,
		func(domain.Token) bool { return true },
		func(context.Context, usecase.LockedStore) error { t.Error("fn ran"); return nil })
	if !errors.Is(err, domain.ErrLockTimeout) {
		t.Fatalf("err = %v, want ErrLockTimeout", err)
	}
	if _, _, err := r2.InLockUnless(context.Background(), "nobody", time.Second, time.Second,
		func(domain.Token) bool { return true },
		func(context.Context, usecase.LockedStore) error { return nil }); !errors.Is(err, domain.ErrNotFound) {
		t.Fatalf("unregistered connection: %v, want ErrNotFound", err)
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
// to be given back: a transaction that only read ends after its caller
// has its answer (InLockUnless), within rollbackTimeout.
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
// transaction must work in every mode, the re-read included.
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
				tok, done, err := r.InLockUnless(context.Background(), name, 5*time.Second, time.Second,
					func(t domain.Token) bool { return t.Version > v1.Version },
					func(context.Context, usecase.LockedStore) error { return errors.New("ran although settled") })
				if err == nil && !done {
					err = errors.New("not settled by the holder")
				}
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
