package usecase

import (
	"context"
	"errors"
	"fmt"

	"github.com/tokenguard/tokenguard/domain"
)

// ProofKeys reads the DPoP key (RFC 9449) a connection's grant is bound
// to; the token store is one.
type ProofKeys interface {
	// DPoPKey is connection's private key (PEM) whose thumbprint is jkt.
	DPoPKey(ctx context.Context, connection, jkt string) (domain.Secret, error)
}

// BoundRefresher redeems refresh tokens bound to a DPoP key: every token
// request carries a proof signed with key.
type BoundRefresher interface {
	RefreshBound(ctx context.Context, provider string, refreshToken, key domain.Secret) (domain.Grant, error)
}

var errUnbound = errors.New("the grant is bound to a DPoP key and the refresher cannot sign proofs")

// present presents t's refresh token, with a proof of its key when the
// grant is sender-constrained.
func (u *RefreshTokenUseCase) present(ctx context.Context, t domain.Token) (domain.Grant, error) {
	if !t.SenderConstrained() {
		return u.refresher.Refresh(ctx, t.Provider, t.RefreshToken)
	}
	keys, ok := u.store.(ProofKeys)
	bound, ok2 := u.refresher.(BoundRefresher)
	if !ok || !ok2 {
		return domain.Grant{}, &domain.ProviderError{Class: domain.EndpointMisconfigured, Err: errUnbound}
	}
	key, err := keys.DPoPKey(ctx, t.Connection, t.DPoPJKT)
	if err != nil {
		return domain.Grant{}, fmt.Errorf("refresh %s: %w", t.Connection, err)
	}
	return bound.RefreshBound(ctx, t.Provider, t.RefreshToken, key)
}
