package repository_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/internal/pgserver"
	"github.com/tokenguard/tokenguard/repository"
)

// A replica (a server in recovery) is refused with ErrReadOnlyStore; the
// primary (the control) is accepted.
func TestCheckPrimaryRefusesAReplica(t *testing.T) {
	r, _, _ := newRepo(t)
	ctx := context.Background()
	if err := r.CheckPrimary(ctx); err != nil {
		t.Fatalf("primary: %v", err)
	}
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	standby, err := pgserver.StartStandby(startCtx)
	if err != nil {
		t.Skipf("no throw-away standby cluster: %v", err)
	}
	t.Cleanup(standby.Close)
	replica := repository.NewTokenRepository(open(t, standby.URL), tokencrypt.Plaintext{})
	err = replica.CheckPrimary(ctx)
	if !errors.Is(err, domain.ErrReadOnlyStore) {
		t.Fatalf("replica: err = %v, want ErrReadOnlyStore", err)
	}
	t.Log(err)
}
