package di

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/internal/sandbox"
)

// A refresh token is presented once per refresh. x/oauth2's auth style
// auto-detection sends a failed token request again in the other style:
// for a process whose first refresh fails, that is the same refresh token
// twice (the provider counts two rejections; after an ambiguous failure it
// would be reuse). The apps' configuration never leaves the style to it.
func TestRejectedRefreshIsOneRequest(t *testing.T) {
	p, err := sandbox.New(sandbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p.Handler())
	defer srv.Close()
	sc := p.OAuth2Config(srv.URL)
	ctx := context.Background()
	tok, err := sandbox.Grant(ctx, sc)
	if err != nil {
		t.Fatal(err)
	}
	p.RevokeAll()
	rt := domain.NewSecret(tok.RefreshToken)

	rejected := func(cfg *oauth2.Config) int64 {
		before := p.Stats().RefreshRejected
		if _, err := provider.NewRefresher(cfg, nil).Refresh(ctx, rt); !errors.Is(err, domain.ErrGrantRevoked) {
			t.Fatalf("refresh of a revoked grant: %v", err)
		}
		return p.Stats().RefreshRejected - before
	}
	// The control: left to x/oauth2, the style is probed (nothing has
	// succeeded at this token URL yet, so nothing is cached).
	auto := OAuth2Config(OAuthConfig{ClientID: sc.ClientID, ClientSecret: sc.ClientSecret, TokenURL: sc.Endpoint.TokenURL})
	auto.Endpoint.AuthStyle = oauth2.AuthStyleAutoDetect
	if n := rejected(auto); n != 2 {
		t.Fatalf("auto-detected auth style: %d requests, want 2 (the control no longer shows the probe)", n)
	}
	for _, style := range []string{"", "header", "params"} {
		cfg := OAuth2Config(OAuthConfig{ClientID: sc.ClientID, ClientSecret: sc.ClientSecret, TokenURL: sc.Endpoint.TokenURL, AuthStyle: style})
		if n := rejected(cfg); n != 1 {
			t.Errorf("OAUTH_AUTH_STYLE=%q: %d requests for one refresh, want 1", style, n)
		}
	}
}
