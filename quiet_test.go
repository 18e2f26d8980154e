package tokenguard_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/base64"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard"
	"github.com/tokenguard/tokenguard/internal/sandbox"
)

// logLines is a JSON log that tests count the lines of, by level.
type logLines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logLines) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(lockedWriter{&l.mu, &l.buf}, nil))
}

// count is the number of lines at level (INFO, WARN, ERROR).
func (l *logLines) count(level string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.buf.String(), `"level":"`+level+`"`)
}

func (l *logLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

var testKeys = "k1=" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32)) + "*"

// The batch pattern (no Run): New, Import, many calls, a refresh, Close.
// The whole process logs one INFO line (the cache is bypassed), the one
// line of the refresh, and nothing at WARN or ERROR.
func TestQuietWithoutRun(t *testing.T) {
	w := newWorld(t, sandbox.Options{AccessTokenLifespan: 2 * time.Second})
	var logs logLines
	tg := newTokens(t, w, w.open(t, nil), tokenguard.WithSkew(time.Second),
		tokenguard.WithEncryptionKeys(testKeys), tokenguard.WithLogger(logs.logger()))
	ctx := context.Background()
	if err := tg.Import(ctx, "acme", w.grant(t)); err != nil {
		t.Fatal(err)
	}
	first, err := tg.Token(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	for range 50 {
		if code := get(t, tg.Client(ctx, "acme"), w.srv.URL); code != http.StatusOK {
			t.Fatalf("resource answered %d", code)
		}
	}
	time.Sleep(time.Until(first.Expiry) + 100*time.Millisecond)
	for range 50 {
		if _, err := tg.Token(ctx, "acme"); err != nil {
			t.Fatal(err)
		}
	}
	if err := tg.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if st := w.provider.Stats(); st.Refreshes != 1 {
		t.Fatalf("%d refreshes, want 1", st.Refreshes)
	}
	refreshes := strings.Count(logs.String(), `"msg":"token refresh"`)
	if info, warn, errs := logs.count("INFO")-refreshes, logs.count("WARN"), logs.count("ERROR"); refreshes != 1 || info != 1 || warn != 0 || errs != 0 {
		t.Fatalf("%d refresh lines, %d other INFO, %d WARN, %d ERROR lines; want 1, 1, 0, 0:\n%s", refreshes, info, warn, errs, logs.String())
	}
	if !strings.Contains(logs.String(), "bypassed until Run is running") {
		t.Errorf("the INFO line does not say the cache is bypassed:\n%s", logs.String())
	}
}

// The documented order: go Run, WaitReady, calls, cancel Run's context,
// Close, close the pool. WaitReady returns once the cache is live, the
// calls after it are served from the cache, and nothing is logged at WARN
// or ERROR from start to end.
func TestRunReadyAndQuietClose(t *testing.T) {
	w := newWorld(t, sandbox.Options{AccessTokenLifespan: 2 * time.Second})
	var logs logLines
	db := w.open(t, nil)
	tg := newTokens(t, w, db, tokenguard.WithSkew(time.Second),
		tokenguard.WithEncryptionKeys(testKeys), tokenguard.WithLogger(logs.logger()))
	ctx := context.Background()
	if err := tg.Import(ctx, "acme", w.grant(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-tg.Ready():
		t.Fatal("Ready before Run")
	default:
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- tg.Run(runCtx) }()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := tg.WaitReady(wctx); err != nil {
		t.Fatalf("WaitReady: %v", err)
	}
	select {
	case <-tg.Ready():
	default:
		t.Fatal("WaitReady returned, Ready still open")
	}
	first, err := tg.Token(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(first.Expiry) + 100*time.Millisecond)
	for range 20 {
		if code := get(t, tg.Client(ctx, "acme"), w.srv.URL); code != http.StatusOK {
			t.Fatalf("resource answered %d", code)
		}
	}
	stop()
	if err := <-ran; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := tg.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if sqlDB, err := db.DB(); err == nil {
		_ = sqlDB.Close()
	}
	time.Sleep(200 * time.Millisecond) // anything logged after the pool closed shows up
	if warn, errs := logs.count("WARN"), logs.count("ERROR"); warn != 0 || errs != 0 {
		t.Fatalf("%d WARN, %d ERROR lines; want none:\n%s", warn, errs, logs.String())
	}
	if st := w.provider.Stats(); st.Refreshes != 1 || st.RefreshReuse != 0 {
		t.Fatalf("provider: %d refreshes, %d reuses; want 1, 0", st.Refreshes, st.RefreshReuse)
	}
}

// New refuses a *gorm.DB over a *sql.DB, whose database Run could never
// listen on, with ErrCannotListen (rather than a Run failing later, its
// error discarded by "go tokens.Run(ctx)"); the same handle with
// WithListenDSN is accepted and its Run makes the cache live.
func TestNewRefusesAHandleItCannotListenOn(t *testing.T) {
	w := newWorld(t, sandbox.Options{})
	sqlDB, err := sql.Open("pgx", w.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sqlDB.Close() })
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := tokenguard.Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	if tg, err := tokenguard.New(db, w.oauth); !errors.Is(err, tokenguard.ErrCannotListen) {
		if tg != nil {
			_ = tg.Close(context.Background())
		}
		t.Fatalf("New over a *sql.DB = %v, want ErrCannotListen", err)
	}
	if _, err := tokenguard.New(db, w.oauth, tokenguard.WithListenDSN("postgres://user:s3cret@[::1")); !errors.Is(err, tokenguard.ErrCannotListen) ||
		strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("New with a DSN that does not parse = %v, want ErrCannotListen without the password", err)
	}

	tg := newTokens(t, w, db, tokenguard.WithListenDSN(w.url)) // the control
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go func() { _ = tg.Run(ctx) }()
	if err := tg.WaitReady(ctx); err != nil {
		t.Fatalf("WaitReady with WithListenDSN: %v", err)
	}
}
