package tokenguard_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/tokenguard/tokenguard"
	"github.com/tokenguard/tokenguard/internal/sandbox"
)

func TestWithTokenRateIsValidated(t *testing.T) {
	w := newWorld(t, sandbox.Options{})
	db := w.open(t, nil)
	if err := tokenguard.Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	_, err := tokenguard.New(db, w.oauth, tokenguard.WithTokenRate("20 a second"))
	if !errors.Is(err, tokenguard.ErrInvalidTokenRate) || !strings.Contains(err.Error(), "20 a second") {
		t.Fatalf("New with token rate \"20 a second\" = %v, want ErrInvalidTokenRate naming it", err)
	}
	newTokens(t, w, db, tokenguard.WithTokenRate("100/1m"))
}
