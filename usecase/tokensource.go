package usecase

import (
	"context"

	"golang.org/x/oauth2"
)

// TokenSource returns an oauth2.TokenSource for one connection, using ctx
// for every Token call. The token never carries the refresh token, and its
// Expiry is expiry minus skew, so a caching wrapper such as
// oauth2.ReuseTokenSource lets go of it no later than tokenguard would.
func (u *RefreshTokenUseCase) TokenSource(ctx context.Context, connection string) oauth2.TokenSource {
	return &connectionSource{ctx: ctx, uc: u, id: connection}
}

type connectionSource struct {
	ctx context.Context
	uc  *RefreshTokenUseCase
	id  string
}

func (s *connectionSource) Token() (*oauth2.Token, error) {
	t, err := s.uc.Token(s.ctx, s.id)
	if err != nil {
		return nil, err
	}
	out := &oauth2.Token{AccessToken: t.AccessToken.Reveal(), TokenType: t.TokenType}
	if !t.Expiry.IsZero() {
		out.Expiry = t.Expiry.Add(-t.EffectiveSkew(s.uc.skewOf(t)))
	}
	return out, nil
}
