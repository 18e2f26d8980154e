package tokenguard_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard"
	"github.com/tokenguard/tokenguard/internal/sandbox"
)

// The library's errors name the oauth2.Config field to check, never the
// bundled apps' environment variables.
func TestErrorsNameTheOAuth2ConfigFields(t *testing.T) {
	w := newWorld(t, sandbox.Options{AccessTokenLifespan: 2 * time.Second})
	db := w.open(t, nil)
	good := newTokens(t, w, db)
	ctx := context.Background()
	if err := good.Import(ctx, "acme", w.grant(t)); err != nil {
		t.Fatal(err)
	}
	wrong := *w.oauth
	wrong.ClientSecret = "not-the-secret"
	tg, err := tokenguard.New(db, &wrong, tokenguard.WithSkew(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close(ctx)
	time.Sleep(2100 * time.Millisecond) // expired: no still-valid token to serve
	_, err = tg.Token(ctx, "acme")
	if !errors.Is(err, tokenguard.ErrClientRejected) {
		t.Fatalf("wrong client secret: err = %v, want ErrClientRejected", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "ClientSecret") || strings.Contains(msg, "OAUTH_") || strings.Contains(msg, "not-the-secret") {
		t.Errorf("err = %q: want the oauth2.Config field named, no environment variable, no secret", msg)
	}
}

// The application's own queries hold every connection of its pool. Token
// on a connection not in the cache cannot read the store: it fails, within
// the caller's time, with ErrStoreUnavailable or ErrLockTimeout wrapping
// the cause, never a bare context.DeadlineExceeded that looks like the
// caller's own.
func TestTokenWithThePoolExhaustedByTheApp(t *testing.T) {
	w := newWorld(t, sandbox.Options{})
	db := w.open(t, nil)
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	sqlDB.SetMaxOpenConns(2)
	tg := newTokens(t, w, db, tokenguard.WithLockWait(time.Second))
	ctx := context.Background()
	if err := tg.Import(ctx, "acme", w.grant(t)); err != nil {
		t.Fatal(err)
	}
	// The application's queries: both connections, held.
	for range 2 {
		conn, err := sqlDB.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
	}
	callCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = tg.Token(callCtx, "acme")
	if callCtx.Err() != nil {
		t.Fatalf("Token waited for the caller's whole deadline: %v", err)
	}
	if !errors.Is(err, tokenguard.ErrStoreUnavailable) && !errors.Is(err, tokenguard.ErrLockTimeout) {
		t.Fatalf("pool exhausted by the application: err = %v, want ErrStoreUnavailable or ErrLockTimeout", err)
	}
}
