package usecase

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// DisconnectStore deletes a connection's token under its lock.
type DisconnectStore interface {
	// Disconnect takes the connection's lock (waiting at most wait), reads
	// its token, calls before with it, and unless before fails deletes the
	// token, announces the change to every process and commits. It
	// returns the deleted token.
	Disconnect(ctx context.Context, connection string, wait time.Duration,
		before func(ctx context.Context, t domain.Token) (revoked bool, err error)) (domain.Token, error)
	// Leased reports whether another process's refresh of t's version may
	// still be at the provider (a live refresh lease; LockedStore.Lease).
	Leased(ctx context.Context, t domain.Token) (bool, error)
}

// Revoker revokes a refresh token at the revocation endpoint of the
// connection's provider (RFC 7009). It returns an error wrapping
// domain.ErrNoRevocationEndpoint when that provider has none.
type Revoker interface {
	Revoke(ctx context.Context, provider string, refreshToken domain.Secret) error
}

// DefaultRevokeTimeout bounds a revocation request, which runs while the
// connection's lock is held.
const DefaultRevokeTimeout = 10 * time.Second

// DisconnectUseCase removes connections.
type DisconnectUseCase struct {
	store    DisconnectStore
	revoker  Revoker // nil: no revocation endpoint anywhere
	lockWait time.Duration
	timeout  time.Duration
}

// NewDisconnectUseCase builds the use case. revoker may be nil;
// lockWait <= 0 means DefaultLockWait, revokeTimeout <= 0
// DefaultRevokeTimeout.
func NewDisconnectUseCase(store DisconnectStore, revoker Revoker, lockWait, revokeTimeout time.Duration) *DisconnectUseCase {
	if lockWait <= 0 {
		lockWait = DefaultLockWait
	}
	if revokeTimeout <= 0 {
		revokeTimeout = DefaultRevokeTimeout
	}
	return &DisconnectUseCase{store: store, revoker: revoker, lockWait: lockWait, timeout: revokeTimeout}
}

// Disconnect deletes connection's token, so that no process serves or
// refreshes it again, after revoking its refresh token at the provider when
// revoke is true.
//
// Order: the lock, the re-read, the revocation, then the delete, all in
// one transaction holding the lock. Under the lock the refresh token read
// is the current one and no refresh can rotate it before it is revoked.
// The revocation comes first because a failed one keeps the connection:
// the refresh token is the only way to revoke the grant, and deleting it
// after a failed revocation would leave a live grant at the provider that
// nobody can revoke any more. So a revocation that fails (the provider
// unavailable, the client rejected, no revocation endpoint configured)
// changes nothing and is returned; the caller tries again, or disconnects
// without revoking. A provider that answers that the token is already
// invalid has nothing left to revoke: that is a success.
//
// It returns the deleted token (its refresh token is spent or abandoned:
// never use it).
func (u *DisconnectUseCase) Disconnect(ctx context.Context, connection string, revoke bool) (domain.Token, error) {
	if err := domain.ValidateName(connection); err != nil {
		return domain.Token{}, err
	}
	t, err := u.store.Disconnect(ctx, connection, u.lockWait, func(ctx context.Context, t domain.Token) (bool, error) {
		if !revoke {
			return false, nil
		}
		if u.revoker == nil {
			return false, fmt.Errorf("revoke: %w", domain.ErrNoRevocationEndpoint)
		}
		// A refresh that lost the lock may be rotating this very refresh
		// token: revoking it now could leave the rotated one alive at the
		// provider once the connection is gone.
		if leased, err := u.store.Leased(ctx, t); err != nil || leased {
			if err == nil {
				err = domain.ErrRefreshInProgress
			}
			return false, fmt.Errorf("revoke: %w", err)
		}
		rctx, cancel := context.WithTimeout(ctx, u.timeout)
		defer cancel()
		if err := u.revoker.Revoke(rctx, t.Provider, t.RefreshToken); err != nil {
			return false, fmt.Errorf("revoke: %w", err)
		}
		return true, nil
	})
	if err != nil {
		if errors.Is(err, domain.ErrNotFound) {
			return domain.Token{}, fmt.Errorf("disconnect %s: %w", connection, domain.ErrNotFound)
		}
		return domain.Token{}, fmt.Errorf("disconnect %s: %w (nothing changed)", connection, err)
	}
	return t, nil
}
