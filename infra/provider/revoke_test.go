package provider_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/internal/sandbox"
)

// Against the sandbox restricted to one client authentication method:
// the named style is used as it is, auto tries HTTP Basic and then the
// form body, and the grant dies at the provider.
func TestRevokeAtTheSandbox(t *testing.T) {
	for _, method := range []string{sandbox.ClientAuthBasic, sandbox.ClientAuthPost} {
		t.Run(method, func(t *testing.T) {
			p, err := sandbox.New(sandbox.Options{ClientAuth: method})
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(p.Handler())
			defer srv.Close()
			cfg := p.OAuth2Config(srv.URL)
			endpoint := provider.RevocationEndpoint{URL: sandbox.RevocationURL(srv.URL), ClientID: cfg.ClientID,
				ClientSecret: domain.NewSecret(cfg.ClientSecret), TokenURL: cfg.Endpoint.TokenURL}
			wrong := oauth2.AuthStyleInParams
			if method == sandbox.ClientAuthPost {
				wrong = oauth2.AuthStyleInHeader
			}
			for _, tc := range []struct {
				style oauth2.AuthStyle
				ok    bool
			}{{wrong, false}, {oauth2.AuthStyleAutoDetect, true}} {
				tok, err := sandbox.Grant(context.Background(), cfg)
				if err != nil {
					t.Fatal(err)
				}
				e := endpoint
				e.AuthStyle = tc.style
				err = provider.NewRevocations(e, nil, nil, srv.Client(), nil).Revoke(context.Background(), "", domain.NewSecret(tok.RefreshToken))
				if tc.ok != (err == nil) || (!tc.ok && !errors.Is(err, domain.ErrClientRejected)) {
					t.Fatalf("style %v: %v", tc.style, err)
				}
				_, refreshErr := cfg.TokenSource(context.Background(), &oauth2.Token{RefreshToken: tok.RefreshToken}).Token()
				if tc.ok == (refreshErr == nil) {
					t.Errorf("style %v: refresh after the revocation: %v", tc.style, refreshErr)
				}
			}
			if n := p.Stats().Revocations; n != 1 {
				t.Errorf("revocations %d, want 1", n)
			}
		})
	}
}

// What each answer means; none echoes the token or the body.
func TestRevocationAnswers(t *testing.T) {
	var status atomic.Int32
	var body atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.PostFormValue("token") != "rt-secret" || r.PostFormValue("token_type_hint") != "refresh_token" {
			w.WriteHeader(http.StatusTeapot)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(int(status.Load()))
		_, _ = w.Write([]byte(body.Load().(string)))
	}))
	defer srv.Close()
	r := provider.NewRevocations(provider.RevocationEndpoint{URL: srv.URL, ClientID: "c", AuthStyle: oauth2.AuthStyleInHeader}, nil, nil, srv.Client(), nil)
	refused := errors.New("refused: an error naming the status and code")
	for _, tc := range []struct {
		status int
		body   string
		want   error // nil: revoked
	}{
		{200, ``, nil},
		{400, `{"error":"invalid_grant"}`, nil}, // nothing left to revoke
		{400, `{"error":"invalid_token"}`, nil},
		{503, `{"error":"temporarily_unavailable"}`, domain.ErrProviderUnavailable},
		{429, ``, domain.ErrProviderUnavailable},
		{401, `{"error":"invalid_client"}`, domain.ErrClientRejected},
		{404, `<html>`, domain.ErrEndpointMisconfigured},
		{400, `{"error":"unsupported_token_type"}`, refused},
		{400, `{"error":"rt-secret leaked"}`, refused},
	} {
		status.Store(int32(tc.status))
		body.Store(tc.body)
		err := r.Revoke(context.Background(), "", domain.NewSecret("rt-secret"))
		switch {
		case tc.want == nil && err != nil:
			t.Errorf("%d %s: %v, want revoked", tc.status, tc.body, err)
		case tc.want == refused && (err == nil || !strings.Contains(err.Error(), "HTTP 400")):
			t.Errorf("%d %s: %v, want a refusal naming the status", tc.status, tc.body, err)
		case tc.want != nil && tc.want != refused && !errors.Is(err, tc.want):
			t.Errorf("%d %s: %v, want %v", tc.status, tc.body, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "rt-secret") {
			t.Errorf("%d %s: the error shows the token: %v", tc.status, tc.body, err)
		}
	}
	if err := provider.NewRevocations(provider.RevocationEndpoint{}, nil, nil, srv.Client(), nil).Revoke(context.Background(), "", domain.NewSecret("x")); !errors.Is(err, domain.ErrNoRevocationEndpoint) ||
		!strings.Contains(err.Error(), "OAUTH_REVOCATION_URL") {
		t.Errorf("no endpoint: %v", err)
	}
	if err := r.Revoke(context.Background(), "other", domain.NewSecret("x")); !errors.Is(err, domain.ErrUnknownProvider) {
		t.Errorf("another provider: %v", err)
	}
}
