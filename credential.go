package tokenguard

import (
	"cmp"
	"context"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
)

// Credential is a connection's access token with its provider and the
// version a 401 is reported against (ForceRefresh).
type Credential struct {
	Token      *oauth2.Token // as Token returns it
	Connection string
	Provider   string // "" for the one of New's oauth2.Config
	Version    int64  // bumped by every refresh
	DPoPJKT    string // the grant's DPoP key's thumbprint; "" for bearer (see DPoPProof)
}

// Credential returns connection's access token as Token does, with its
// provider and version.
func (t *Tokens) Credential(ctx context.Context, connection string) (Credential, error) {
	return t.credential(apiTokens{t}.Token(ctx, connection))
}

// ForceRefresh returns connection's token after the API refused version stale (a 401): one refresh
// fleet-wide per version, at most one per 5 s or half the token's lifetime (else ErrRefreshRateLimited).
func (t *Tokens) ForceRefresh(ctx context.Context, connection string, stale int64) (Credential, error) {
	return t.credential(apiTokens{t}.ForceRefresh(ctx, connection, stale))
}

// credential is tok as callers see it: its Expiry moved back by the skew.
func (t *Tokens) credential(tok domain.Token, err error) (Credential, error) {
	if err != nil {
		return Credential{}, err
	}
	out := &oauth2.Token{AccessToken: tok.AccessToken.Reveal(), TokenType: tok.TokenType}
	if !tok.Expiry.IsZero() {
		out.Expiry = tok.Expiry.Add(-tok.EffectiveSkew(cmp.Or(t.providers.Skew(tok.Provider), t.o.Skew)))
	}
	return Credential{Token: out, Connection: tok.Connection, Provider: tok.Provider, Version: tok.Version, DPoPJKT: tok.DPoPJKT}, nil
}
