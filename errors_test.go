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
