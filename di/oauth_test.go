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

// A refresh token is presented once per refresh that fails for any reason
// but client authentication. x/oauth2's auth style auto-detection sends a
// failed token request again in the other style: for a refresh whose
// grant the provider rejected, that is the same refresh token twice (the
// provider counts two rejections; after an ambiguous failure it would be
// reuse). The apps' styles, auto (the default) included, never do.
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

	rejected := func(refresh func() error) int64 {
		before := p.Stats().RefreshRejected
		if err := refresh(); err == nil {
			t.Fatal("refresh of a revoked grant succeeded")
		}
		return p.Stats().RefreshRejected - before
	}
	// The control: x/oauth2 left to probe (nothing has succeeded at this
	// token URL yet, so nothing is cached).
	xauto := OAuth2Config(OAuthConfig{ClientID: sc.ClientID, ClientSecret: domain.NewSecret(sc.ClientSecret), TokenURL: sc.Endpoint.TokenURL, AuthStyle: "auto"})
	if n := rejected(func() error {
		_, err := xauto.TokenSource(ctx, &oauth2.Token{RefreshToken: rt.Reveal()}).Token()
		return err
	}); n != 2 {
		t.Fatalf("x/oauth2 auto-detection: %d requests, want 2 (the control no longer shows the probe)", n)
	}
	for _, style := range []string{"", "auto", "header", "params"} {
		cfg := OAuth2Config(OAuthConfig{ClientID: sc.ClientID, ClientSecret: domain.NewSecret(sc.ClientSecret), TokenURL: sc.Endpoint.TokenURL, AuthStyle: style})
		if n := rejected(func() error {
			_, err := provider.NewRefresher(cfg, nil).Refresh(ctx, rt)
			if !errors.Is(err, domain.ErrGrantRevoked) {
				t.Errorf("OAUTH_AUTH_STYLE=%q: err = %v, want ErrGrantRevoked", style, err)
			}
			return err
		}); n != 1 {
			t.Errorf("OAUTH_AUTH_STYLE=%q: %d requests for one refresh, want 1", style, n)
		}
	}
}
