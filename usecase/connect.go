package usecase

import (
	"context"
	"errors"
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

// Connect stores g as connection's token and makes the connection active.
// It takes the connection's lock, so it never interleaves with a refresh:
// a refresh that started before it has finished, and one that starts after
// it redeems the new grant.
func (u *ConnectUseCase) Connect(ctx context.Context, connection string, g domain.Grant) (domain.Token, error) {
	return u.ConnectAs(ctx, connection, g, domain.Binding{}, true)
}

// ConnectAs is Connect for a grant whose account is known (b.Account): if
// the connection is bound to another account, the grant is refused with
// domain.ErrAccountMismatch and nothing is stored, unless allowChange. The
// check and the write happen under the connection's lock, so two consents
// cannot both pass it.
func (u *ConnectUseCase) ConnectAs(ctx context.Context, connection string, g domain.Grant, b domain.Binding, allowChange bool) (domain.Token, error) {
	return u.connect(ctx, connection, "", g, b, allowChange)
}

// ConnectWith is Connect for a grant issued by the stored provider called
// provider ("" is the provider of the process's configuration): the
// connection's refreshes go there from now on. An unregistered provider
// is refused with domain.ErrUnknownProvider and no token is stored.
func (u *ConnectUseCase) ConnectWith(ctx context.Context, connection, provider string, g domain.Grant) (domain.Token, error) {
	return u.connect(ctx, connection, provider, g, domain.Binding{}, true)
}

func (u *ConnectUseCase) connect(ctx context.Context, connection, provider string, g domain.Grant, b domain.Binding, allowChange bool) (domain.Token, error) {
	tok, err := domain.NewToken(connection, g, u.clock.Now())
	if err != nil {
		return domain.Token{}, err
	}
	tok.Binding, tok.Provider = b, provider
	if err := u.store.Register(ctx, connection); err != nil {
		return domain.Token{}, fmt.Errorf("connect %s: %w", connection, err)
	}
	var out domain.Token
	err = u.store.InLock(ctx, connection, u.lockWait, DefaultWriteTimeout, func(txCtx context.Context, s LockedStore) error {
		if !allowChange {
			cur, err := s.Get(txCtx, connection)
			switch {
			case errors.Is(err, domain.ErrNotFound):
			case err != nil:
				return err
			case cur.Binding.Account != "" && cur.Binding.Account != b.Account:
				return domain.ErrAccountMismatch
			}
		}
		out, err = s.Put(txCtx, tok)
		return err
	})
	if err != nil {
		return domain.Token{}, fmt.Errorf("connect %s: %w", connection, err)
	}
	return out, nil
}
