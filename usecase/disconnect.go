package usecase

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// DisconnectStore deletes a connection's token under its lock.
type DisconnectStore interface {
	// Disconnect, under the connection's lock (waiting at most wait), calls before with the token
	// and unless it fails deletes the token, announces it and commits; it returns the token.
	Disconnect(ctx context.Context, connection string, wait time.Duration,
		before func(ctx context.Context, t domain.Token) (revoked bool, err error)) (domain.Token, error)
	// Read and Claim are TokenStore's: a revocation leases the refresh token it revokes, so that
	// no refresh presents it meanwhile.
	Read(ctx context.Context, connection string) (domain.Token, Lease, error)
	Claim(ctx context.Context, seen domain.Token, answerWithin time.Duration) (Claim, error)
	ProofKeys // the key a bound grant's revocation carries a proof of
}

// Revoker revokes a refresh token at the provider's revocation endpoint (RFC 7009);
// domain.ErrNoRevocationEndpoint when it has none.
type Revoker interface {
	Revoke(ctx context.Context, provider string, refreshToken domain.Secret) error
	// RevokeBound revokes a refresh token bound to a DPoP key, with a proof signed with key.
	RevokeBound(ctx context.Context, provider string, refreshToken, key domain.Secret) error
}

// DefaultRevokeTimeout bounds a revocation request.
const DefaultRevokeTimeout = 10 * time.Second

// DisconnectUseCase removes connections.
type DisconnectUseCase struct {
	store    DisconnectStore
	revoker  Revoker // nil: no revocation endpoint anywhere
	lockWait time.Duration
	timeout  time.Duration
}

// NewDisconnectUseCase builds the use case; revoker may be nil, durations <= 0 take their defaults.
func NewDisconnectUseCase(store DisconnectStore, revoker Revoker, lockWait, revokeTimeout time.Duration) *DisconnectUseCase {
	return &DisconnectUseCase{store: store, revoker: revoker, lockWait: cmp.Or(max(lockWait, 0), DefaultLockWait),
		timeout: cmp.Or(max(revokeTimeout, 0), DefaultRevokeTimeout)}
}

// Disconnect deletes connection's token, after revoking its refresh token at the provider when
// revoke is true: the lease (no refresh presents the token meanwhile), the revocation (holding no
// lock or database connection), the delete. A failed revocation changes nothing and is returned:
// deleting the only way to revoke a live grant would strand it; a token already invalid at the
// provider counts as revoked. The deleted token is returned; its refresh token must never be used.
func (u *DisconnectUseCase) Disconnect(ctx context.Context, connection string, revoke bool) (domain.Token, error) {
	if err := domain.ValidateName(connection); err != nil {
		return domain.Token{}, err
	}
	var before func(ctx context.Context, t domain.Token) (bool, error)
	if revoke {
		leased, end, err := u.revoke(ctx, connection)
		if err != nil {
			return domain.Token{}, u.failed(connection, err)
		}
		defer end(true)
		before = func(_ context.Context, t domain.Token) (bool, error) {
			if t.Version != leased.Version { // the lease keeps refreshes out: not expected
				return false, fmt.Errorf("%w: version %d was revoked, %d is stored", domain.ErrConflict, leased.Version, t.Version)
			}
			return true, nil
		}
	}
	t, err := u.store.Disconnect(ctx, connection, u.lockWait, before)
	switch {
	case err != nil && revoke:
		return domain.Token{}, fmt.Errorf("disconnect %s: its refresh token was revoked at the provider, but deleting the connection failed: %w", connection, err)
	case err != nil:
		return domain.Token{}, u.failed(connection, err)
	}
	return t, nil
}

// revoke leases connection's refresh token and revokes it at the provider, returning it and the
// lease's end; on an error the lease has ended and nothing changed.
func (u *DisconnectUseCase) revoke(ctx context.Context, connection string) (domain.Token, func(bool), error) {
	if u.revoker == nil {
		return domain.Token{}, nil, fmt.Errorf("revoke: %w", domain.ErrNoRevocationEndpoint)
	}
	// A refresh of this refresh token may be at the provider: revoking now could leave the rotated alive.
	lockCtx, cancel := context.WithTimeout(ctx, u.lockWait)
	c := Claim{}
	t, _, err := u.store.Read(lockCtx, connection)
	// A refresh may store a newer token between the read and the claim: claim that one.
	for try := 0; err == nil && try < 3; try++ {
		if c, err = u.store.Claim(lockCtx, t, u.timeout); err != nil || c.End != nil || c.Lease.Running || c.Token.Version == t.Version {
			break
		}
		t = c.Token
	}
	cancel()
	t, end := c.Token, c.End
	switch {
	case err != nil:
		return domain.Token{}, nil, fmt.Errorf("revoke: %w", err)
	case end == nil && t.Status == domain.StatusNeedsReauth:
		end = func(bool) {} // never presented again: nothing to hold off
	case end == nil:
		return domain.Token{}, nil, fmt.Errorf("revoke: %w", domain.ErrRefreshInProgress)
	}
	rctx, cancel := context.WithTimeout(ctx, u.timeout)
	defer cancel()
	var key domain.Secret // a proof of it goes along when the grant is sender-constrained
	if t.SenderConstrained() {
		key, err = u.store.DPoPKey(rctx, t.Connection, t.DPoPJKT)
	}
	if err == nil {
		err = revokeWith(rctx, u.revoker, t.Provider, t.RefreshToken, key)
	}
	if err != nil {
		claimed{Claim: c}.note("not stored: the lease was taken to revoke the grant, and the revocation failed; the connection is kept")
		end(true)
		return domain.Token{}, nil, fmt.Errorf("revoke: %w", err)
	}
	return t, end, nil
}

// revokeWith revokes refreshToken, with a proof of key unless it is zero.
func revokeWith(ctx context.Context, r Revoker, provider string, refreshToken, key domain.Secret) error {
	if !key.IsZero() {
		return r.RevokeBound(ctx, provider, refreshToken, key)
	}
	return r.Revoke(ctx, provider, refreshToken)
}

// failed says that disconnecting connection changed nothing.
func (u *DisconnectUseCase) failed(connection string, err error) error {
	if errors.Is(err, domain.ErrNotFound) {
		return fmt.Errorf("disconnect %s: %w", connection, domain.ErrNotFound)
	}
	return fmt.Errorf("disconnect %s: %w (nothing changed)", connection, err)
}
