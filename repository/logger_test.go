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
	if err := inLock(func(ctx context.Context, l usecase.LockedStore) error {
		_, err := l.Save(ctx, next)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// A version conflict: a failing path.
	if err := inLock(func(ctx context.Context, l usecase.LockedStore) error {
		_, err := l.Save(ctx, next)
		return err
	}); !errors.Is(err, domain.ErrConflict) {
		t.Fatalf("stale save: %v", err)
	}
	if _, err := repo.Get(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	// Failing statements carrying a token, through GORM's Scan finisher,
	// which inlines bound values into what it logs.
	var n int
	verbose.Raw("SELECT ?::int", rt).Scan(&n)
	verbose.Exec("UPDATE tokens SET refresh_token = ? WHERE version = 'x'", rt2)

	out := buf.String()
	if !strings.Contains(out, "UPDATE tokens") || !strings.Contains(out, "SELECT") {
		t.Fatalf("expected the statements in the log, got:\n%s", out)
	}
	for _, secret := range []string{at, rt, rt2, "SECRET"} {
		if strings.Contains(out, secret) {
			t.Errorf("log contains %q:\n%s", secret, out)
		}
	}
}
