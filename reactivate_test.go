package tokenguard_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard"
	"github.com/tokenguard/tokenguard/internal/sandbox"
)

// A grant marked dead by a refused refresh that was not the grant's fault
// comes back with Reactivate, its tokens untouched: the next refresh
// decides, and here the grant is alive. The control: until then, Token
// refuses it.
func TestReactivate(t *testing.T) {
	w := newWorld(t, sandbox.Options{AccessTokenLifespan: 2 * time.Second})
	tg := newTokens(t, w, w.open(t, nil), tokenguard.WithSkew(time.Second))
	ctx := context.Background()
	if err := tg.Import(ctx, "acme", w.grant(t)); err != nil {
		t.Fatal(err)
	}
	if v, err := tg.Reactivate(ctx, "acme"); err != nil || v != 0 {
		t.Errorf("Reactivate of an active connection: %d, %v; want 0 (left alone)", v, err)
	}
	// One refresh answered invalid_grant although the grant is alive.
	var faulted atomic.Bool
	w.provider.SetRefreshFault(func() sandbox.Fault {
		if faulted.Swap(true) {
			return sandbox.FaultNone
		}
		return sandbox.FaultInvalidGrant
	})
	time.Sleep(1100 * time.Millisecond) // within the skew: the next Token refreshes
	if _, err := tg.Token(ctx, "acme"); !errors.Is(err, tokenguard.ErrNeedsReauth) {
		t.Fatalf("Token after invalid_grant: %v, want ErrNeedsReauth", err)
	}
	if _, err := tg.Token(ctx, "acme"); !errors.Is(err, tokenguard.ErrNeedsReauth) {
		t.Fatalf("control: Token before Reactivate: %v, want ErrNeedsReauth", err)
	}
	conns, _, err := tg.Connections(ctx, "", 10)
	if err != nil || len(conns) != 1 || conns[0].Status != "needs_reauth" {
		t.Fatalf("before Reactivate: %+v, %v", conns, err)
	}
	v, err := tg.Reactivate(ctx, "acme")
	if err != nil || v != conns[0].Version+1 {
		t.Fatalf("Reactivate: %d, %v; want version %d", v, err, conns[0].Version+1)
	}
	tok, err := tg.Token(ctx, "acme")
	if err != nil || tok.AccessToken == "" {
		t.Fatalf("Token after Reactivate: %v", err)
	}
	if st := w.provider.Stats(); st.RefreshReuse != 0 {
		t.Errorf("refresh-token reuse = %d", st.RefreshReuse)
	}
	if _, err := tg.Reactivate(ctx, "nobody"); !errors.Is(err, tokenguard.ErrNotFound) {
		t.Errorf("Reactivate of an unknown connection: %v, want ErrNotFound", err)
	}
	if _, err := tg.Reactivate(ctx, "-bad"); !errors.Is(err, tokenguard.ErrInvalidConnection) {
		t.Errorf("Reactivate of a bad name: %v, want ErrInvalidConnection", err)
	}
}
