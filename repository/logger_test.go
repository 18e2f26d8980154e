package repository_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/postgres"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/internal/testdb"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Every statement the repository runs is logged here (level Info), and so
// are failing ones; no token value may appear in the output.
func TestSQLLogsNeverContainTokens(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	var buf syncBuffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	db, err := postgres.Open(context.Background(), testdb.New(t), postgres.Pool{}, repository.NewLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = postgres.Close(db) })
	verbose := db.Session(&gorm.Session{Logger: db.Logger.LogMode(logger.Info)})
	repo := repository.NewTokenRepository(verbose, tokencrypt.Plaintext{})
	ctx := context.Background()

	const at, rt, rt2 = "access-SECRET-1", "refresh-SECRET-1", "refresh-SECRET-2"
	tok, err := domain.NewToken("acme", domain.Grant{AccessToken: domain.NewSecret(at), RefreshToken: domain.NewSecret(rt), Expiry: time.Now().Add(time.Hour)}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := repo.Register(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	inLock := func(fn func(context.Context, usecase.LockedStore) error) error {
		return repo.InLock(ctx, "acme", time.Second, time.Second, fn)
	}
	var stored domain.Token
	if err := inLock(func(ctx context.Context, l usecase.LockedStore) (err error) {
		stored, err = l.Put(ctx, tok)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	next := stored
	next.RefreshToken = domain.NewSecret(rt2)
	if _, err := repo.Store(ctx, next); err != nil {
		t.Fatal(err)
	}
	// A version conflict: a failing path.
	if _, err := repo.Store(ctx, next); !errors.Is(err, domain.ErrConflict) {
		t.Fatalf("stale save: %v", err)
	}
	if _, err := repo.Get(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	// Failing statements carrying a token, through GORM's Scan finisher,
	// which inlines bound values into what it logs.
	var n int
	verbose.Raw("SELECT ?::int", rt).Scan(&n)
	verbose.Exec("UPDATE tokenguard_tokens SET refresh_token = ? WHERE version = 'x'", rt2)

	out := buf.String()
	if !strings.Contains(out, "UPDATE tokenguard_tokens") || !strings.Contains(out, "SELECT") {
		t.Fatalf("expected the statements in the log, got:\n%s", out)
	}
	for _, secret := range []string{at, rt, rt2, "SECRET"} {
		if strings.Contains(out, secret) {
			t.Errorf("log contains %q:\n%s", secret, out)
		}
	}
}

// Failures tokenguard expects and returns as typed errors (a lost race, a
// lock timeout, a cancelled context) are no ERROR line; an unexpected one
// (the control: a statement Postgres cannot run) is.
func TestSQLLogsNoErrorForExpectedFailures(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	var buf syncBuffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	db, err := postgres.Open(context.Background(), testdb.New(t), postgres.Pool{}, repository.NewLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = postgres.Close(db) })
	ctx := context.Background()
	if err := db.Exec("CREATE TABLE race (id int PRIMARY KEY)").Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Exec("INSERT INTO race VALUES (1)").Error; err != nil {
		t.Fatal(err)
	}
	// A lost race: the row exists.
	if err := db.Exec("INSERT INTO race VALUES (1)").Error; err == nil {
		t.Fatal("duplicate insert succeeded")
	}
	// A lock timeout: another transaction holds the row.
	holder := db.Begin()
	defer holder.Rollback()
	if err := holder.Exec("SELECT id FROM race WHERE id = 1 FOR UPDATE").Error; err != nil {
		t.Fatal(err)
	}
	err = db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec("SET LOCAL lock_timeout = '50ms'").Error; err != nil {
			return err
		}
		return tx.Exec("SELECT id FROM race WHERE id = 1 FOR UPDATE").Error
	})
	if err == nil {
		t.Fatal("no lock timeout")
	}
	// A context cancelled mid-statement (a shutdown).
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := db.WithContext(cctx).Exec("SELECT pg_sleep(2)").Error; err == nil {
		t.Fatal("the statement outlived its context")
	}
	if n := strings.Count(buf.String(), `"level":"ERROR"`); n != 0 {
		t.Fatalf("%d ERROR lines for expected failures:\n%s", n, buf.String())
	}
	// Control: an unexpected failure is logged at ERROR.
	_ = db.Exec("SELECT no_such_column FROM race").Error
	if n := strings.Count(buf.String(), `"level":"ERROR"`); n != 1 {
		t.Fatalf("%d ERROR lines after an unexpected failure, want 1:\n%s", n, buf.String())
	}
}
