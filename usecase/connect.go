package usecase

import (
	"context"
	"fmt"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// ConnectUseCase stores the first grant of a connection, or a new grant
// after the old one was revoked (tokenctl import, the OAuth callback).
type ConnectUseCase struct {
	store    ConnectionStore
	clock    Clock
	lockWait time.Duration
}

// NewConnectUseCase builds the use case; a nil clock is the system clock and
// lockWait <= 0 means DefaultLockWait.
func NewConnectUseCase(store ConnectionStore, clock Clock, lockWait time.Duration) *ConnectUseCase {
	if clock == nil {
		clock = systemClock{}
	}
	if lockWait <= 0 {
		lockWait = DefaultLockWait
	}
	return &ConnectUseCase{store: store, clock: clock, lockWait: lockWait}
}

// Connect stores g as connectionID's token and makes the connection active.
// It takes the connection's lock, so it never interleaves with a refresh:
// a refresh that started before it has finished, and one that starts after
// it redeems the new grant.
func (u *ConnectUseCase) Connect(ctx context.Context, connectionID string, g domain.Grant) (domain.Token, error) {
	tok, err := domain.NewToken(connectionID, g, u.clock.Now())
	if err != nil {
		return domain.Token{}, err
	}
	if err := u.store.Register(ctx, connectionID); err != nil {
		return domain.Token{}, fmt.Errorf("connect %s: %w", connectionID, err)
	}
	var out domain.Token
	err = u.store.InLock(ctx, connectionID, u.lockWait, DefaultWriteTimeout, func(txCtx context.Context, s LockedStore) error {
		out, err = s.Put(txCtx, tok)
		return err
	})
	if err != nil {
		return domain.Token{}, fmt.Errorf("connect %s: %w", connectionID, err)
	}
	return out, nil
}
