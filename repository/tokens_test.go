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
	"github.com/tokenguard/tokenguard/infra/postgres"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/internal/testdb"
	"github.com/tokenguard/tokenguard/internal/waitfor"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// open opens a pool on url as the library does (pgx).
func open(tb testing.TB, url string) *gorm.DB {
	tb.Helper()
	db, err := postgres.Open(context.Background(), url, postgres.Pool{MaxOpenConns: 8}, nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = postgres.Close(db) })
	return db
}

func newRepo(t *testing.T) (*repository.TokenRepository, *gorm.DB, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	url := testdb.New(t)
	db := open(t, url)
	return repository.NewTokenRepository(db, tokencrypt.Plaintext{}), db, url
}

func grantToken(id, at, rt string) domain.Token {
	now := time.Now().UTC().Truncate(time.Microsecond)
	tok, err := domain.NewToken(id, domain.Grant{
		AccessToken: domain.NewSecret(at), RefreshToken: domain.NewSecret(rt), Expiry: now.Add(time.Hour),
	}, now)
	if err != nil {
		panic(err)
	}
	return tok
}

func put(t testing.TB, r *repository.TokenRepository, tok domain.Token) domain.Token {
	t.Helper()
	ctx := context.Background()
	if err := r.Register(ctx, tok.Connection); err != nil {
		t.Fatal(err)
	}
	var out domain.Token
	err := r.InLock(ctx, tok.Connection, time.Second, time.Second, func(ctx context.Context, l usecase.LockedStore) error {
		var err error
		out, err = l.Put(ctx, tok)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestPutGetStoreRoundTrip(t *testing.T) {
	r, _, _ := newRepo(t)
	ctx := context.Background()
	if _, err := r.Get(ctx, "acme"); !errors.Is(err, domain.ErrNotFound) {
		t.Fatalf("unknown connection: err = %v", err)
	}
	want := grantToken("acme", "at-1", "rt-1")
	got := put(t, r, want)
	if got.Version != 1 || got.AccessToken.Reveal() != "at-1" || got.RefreshToken.Reveal() != "rt-1" ||
		!got.Expiry.Equal(want.Expiry) || !got.ObtainedAt.Equal(want.ObtainedAt) || got.Status != domain.StatusActive {
		t.Fatalf("stored %+v", got)
	}

	// Store bumps the version and keeps the refresh token when given none.
	next := got
	next.AccessToken, next.RefreshToken = domain.NewSecret("at-2"), domain.Secret{}
	saved, err := r.Store(ctx, next)
	if err != nil {
		t.Fatal(err)
	}
	if saved.Version != 2 || saved.AccessToken.Reveal() != "at-2" || saved.RefreshToken.Reveal() != "rt-1" {
		t.Errorf("saved %+v, rt %q", saved, saved.RefreshToken.Reveal())
	}
	// A write based on an old version is refused.
	if _, err := r.Store(ctx, next); !errors.Is(err, domain.ErrConflict) {
		t.Errorf("stale store: err = %v, want ErrConflict", err)
	}

	// A new grant replaces the old one and the version keeps growing.
	regrant := put(t, r, grantToken("acme", "at-3", "rt-3"))
	if regrant.Version != 3 || regrant.RefreshToken.Reveal() != "rt-3" {
		t.Errorf("regrant %+v", regrant)
	}
	all, err := r.List(ctx)
	if err != nil || len(all) != 1 || all[0].Connection != "acme" {
		t.Errorf("List = %v, %v", all, err)
	}
}

func TestRollbackLeavesTokenUntouched(t *testing.T) {
	r, db, _ := newRepo(t)
	ctx := context.Background()
	orig := put(t, r, grantToken("acme", "at-1", "rt-1"))
	boom := errors.New("provider said no")
	err := r.InLock(ctx, "acme", time.Second, time.Second, func(ctx context.Context, l usecase.LockedStore) error {
		if _, err := l.Get(ctx, "acme"); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the callback's error", err)
	}
	got, _ := r.Get(ctx, "acme")
	if got.Version != orig.Version || got.RefreshToken.Reveal() != "rt-1" {
		t.Errorf("token changed: %+v", got)
	}
	assertNoLocksLeft(t, db)
}

// InLock commits only when fn returns nil: a grant Put in it is rolled
// back with fn's error, and visible to everyone once fn returned nil.
// Store commits before it returns.
func TestInLockCommitsWhenFnReturnsNil(t *testing.T) {
	r, db, url := newRepo(t)
	other := repository.NewTokenRepository(open(t, url), tokencrypt.Plaintext{}) // another process
	ctx := context.Background()
	orig := put(t, r, grantToken("acme", "at-1", "rt-1"))
	boom := errors.New("something after the write failed")
	err := r.InLock(ctx, "acme", time.Second, time.Second, func(ctx context.Context, l usecase.LockedStore) error {
		if _, err := l.Put(ctx, grantToken("acme", "at-2", "rt-2")); err != nil {
			return err
		}
		if got, err := l.Get(ctx, "acme"); err != nil || got.RefreshToken.Reveal() != "rt-2" {
			t.Errorf("re-read after Put in the transaction: %q, %v", got.RefreshToken.Reveal(), err)
		}
		if got, err := other.Get(ctx, "acme"); err != nil || got.Version != orig.Version {
			t.Errorf("another process read version %d before the commit (%v), want %d", got.Version, err, orig.Version)
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the callback's error", err)
	}
	if got, _ := other.Get(ctx, "acme"); got.Version != orig.Version || got.RefreshToken.Reveal() != "rt-1" {
		t.Errorf("the grant of a failed callback was kept: %+v", got)
	}
	put(t, r, grantToken("acme", "at-2", "rt-2"))
	got, _ := other.Get(ctx, "acme")
	if got.Version != orig.Version+1 || got.RefreshToken.Reveal() != "rt-2" {
		t.Errorf("the committed grant: %+v", got)
	}
	next := got
	next.RefreshToken = domain.NewSecret("rt-3")
	if _, err := r.Store(ctx, next); err != nil {
		t.Fatal(err)
	}
	if got, _ := other.Get(ctx, "acme"); got.Version != orig.Version+2 || got.RefreshToken.Reveal() != "rt-3" {
		t.Errorf("after Store returned: %+v", got)
	}
	assertNoLocksLeft(t, db)
}

func TestDatabaseRefusesEmptyRefreshToken(t *testing.T) {
	r, db, _ := newRepo(t)
	put(t, r, grantToken("acme", "at-1", "rt-1"))
	err := db.Exec("UPDATE tokenguard_tokens SET refresh_token = ''").Error
	if err == nil || !strings.Contains(err.Error(), "refresh_token") {
		t.Errorf("empty refresh token accepted by the schema: %v", err)
	}
}

func TestLockExcludesAcrossPoolsAndReleasesAtCommit(t *testing.T) {
	r1, _, url := newRepo(t)
	r2 := repository.NewTokenRepository(open(t, url), tokencrypt.Plaintext{}) // a second "process"
	put(t, r1, grantToken("acme", "at", "rt"))
	ctx := context.Background()

	held := make(chan struct{})
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- r1.InLock(ctx, "acme", time.Second, 5*time.Second, func(context.Context, usecase.LockedStore) error {
			close(held)
			<-release
			return nil
		})
	}()
	<-held

	// Plain reads never wait on the lock.
	if _, err := r2.Get(ctx, "acme"); err != nil {
		t.Fatalf("read blocked or failed under the lock: %v", err)
	}
	// The other pool's waiter hits its bound with a typed error.
	start := time.Now()
	err := r2.InLock(ctx, "acme", 200*time.Millisecond, time.Second, func(context.Context, usecase.LockedStore) error {
		t.Error("ran while another pool held the lock")
		return nil
	})
	if !errors.Is(err, domain.ErrLockTimeout) {
		t.Fatalf("err = %v, want ErrLockTimeout", err)
	}
	if waited := time.Since(start); waited > 3*time.Second {
		t.Errorf("waited %v for a 200ms bound", waited)
	}
	// A different connection is not blocked.
	put(t, r2, grantToken("other", "at", "rt"))

	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Released at commit: the other pool gets it now.
	if err := r2.InLock(ctx, "acme", 200*time.Millisecond, time.Second, func(context.Context, usecase.LockedStore) error { return nil }); err != nil {
		t.Fatalf("lock not released at commit: %v", err)
	}
}

func TestCancelWhileWaitingReturnsPromptlyAndLeaksNothing(t *testing.T) {
	r1, db1, url := newRepo(t)
	db2 := open(t, url)
	r2 := repository.NewTokenRepository(db2, tokencrypt.Plaintext{})
	put(t, r1, grantToken("acme", "at", "rt"))

	held := make(chan struct{})
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- r1.InLock(context.Background(), "acme", time.Second, 10*time.Second, func(context.Context, usecase.LockedStore) error {
			close(held)
			<-release
			return nil
		})
	}()
	<-held

	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(150*time.Millisecond, cancel)
	start := time.Now()
	err := r2.InLock(ctx, "acme", 30*time.Second, time.Second, func(context.Context, usecase.LockedStore) error {
		t.Error("ran while another pool held the lock")
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Errorf("cancelled waiter returned after %v", waited)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// No connection of the cancelled pool is left checked out, and no
	// advisory lock survives on the server.
	sqlDB, _ := db2.DB()
	waitfor.Until(t, 5*time.Second, "pool connections still in use", func() bool { return sqlDB.Stats().InUse == 0 })
	waitfor.Until(t, 5*time.Second, "advisory locks left on the server", func() bool {
		var n int64
		db1.Raw("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())").Scan(&n)
		return n == 0
	})
}

func TestMultiLockTakesSortedOrderWithoutDeadlock(t *testing.T) {
	r, db, _ := newRepo(t)
	names := []string{"a", "b", "c", "d"}
	for _, n := range names {
		put(t, r, grantToken(n, "at", "rt"))
	}
	// Many transactions lock overlapping sets given in opposite orders.
	// Without one canonical order some pair would deadlock (SQLSTATE 40P01).
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 40 {
		set := []string{"a", "b", "c", "d"}
		if i%2 == 1 {
			set = []string{"d", "c", "b", "a", "c"}
		}
		wg.Go(func() {
			errs <- db.Transaction(func(tx *gorm.DB) error {
				if err := r.WithAdvisoryLock(tx, set...); err != nil {
					return err
				}
				time.Sleep(2 * time.Millisecond)
				return nil
			})
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("multi-lock failed: %v", err)
		}
	}
	err := db.Transaction(func(tx *gorm.DB) error { return r.WithAdvisoryLock(tx, "a", "missing") })
	if !errors.Is(err, domain.ErrNotFound) {
		t.Errorf("unregistered connection: err = %v, want ErrNotFound", err)
	}
}

func TestLockIsHeldOnTheTransactionsConnection(t *testing.T) {
	r, db, _ := newRepo(t)
	put(t, r, grantToken("acme", "at", "rt"))
	err := r.InLock(context.Background(), "acme", time.Second, time.Second, func(ctx context.Context, l usecase.LockedStore) error {
		// Another session sees the lock held by a backend other than its own.
		var n int64
		err := db.Raw(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid()
			AND classid = $1 AND objsubid = 2
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, 0x746b6764).Scan(&n).Error
		if err != nil {
			return err
		}
		if n != 1 {
			t.Errorf("advisory locks visible in namespace = %d, want 1", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestDatabaseGoneIsTyped(t *testing.T) {
	r, db, _ := newRepo(t)
	_ = postgres.Close(db)
	if _, err := r.Get(context.Background(), "acme"); !errors.Is(err, domain.ErrStoreUnavailable) {
		t.Errorf("closed pool: err = %v, want ErrStoreUnavailable", err)
	}
	bad := repository.NewTokenRepository(open(t, testdb.URL(t)), tokencrypt.Plaintext{})
	if _, err := bad.Get(context.Background(), "acme"); !errors.Is(err, domain.ErrStoreUnavailable) {
		t.Errorf("missing schema: err = %v, want ErrStoreUnavailable", err)
	}
}
