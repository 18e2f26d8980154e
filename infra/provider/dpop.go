package provider

import (
	"context"
	"fmt"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/dpop"
)

// WithNonces shares the DPoP nonces with the rest of the process.
func WithNonces(n *dpop.Nonces) Option { return func(r *Refresher) { r.nonces = n } }

// proofKey opens a grant's DPoP key for one call's requests; errors never show the key.
func proofKey(ctx context.Context, key domain.Secret) (context.Context, error) {
	k, err := dpop.ParsePEM([]byte(key.Reveal()))
	if err != nil {
		return nil, &domain.ProviderError{Class: domain.EndpointMisconfigured, Err: fmt.Errorf("the grant's DPoP key: %w", err)}
	}
	return dpop.WithKey(ctx, k), nil
}

// RefreshBound redeems a refresh token bound to key (PEM) with a DPoP proof (RFC 9449 §5).
func (r *Registry) RefreshBound(ctx context.Context, provider string, refreshToken, key domain.Secret) (domain.Grant, error) {
	ctx, err := proofKey(ctx, key)
	if err != nil {
		return domain.Grant{}, err
	}
	return r.Refresh(ctx, provider, refreshToken)
}

// DPoP reports whether provider ("" the configuration's: dflt) requires DPoP-bound grants.
func (r *Registry) DPoP(provider string, dflt bool) bool {
	if provider == "" {
		return dflt
	}
	return r.all()[provider].p.DPoP
}
