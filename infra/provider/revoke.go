package provider

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/clientkey"
	"github.com/tokenguard/tokenguard/infra/dpop"
	"github.com/tokenguard/tokenguard/infra/provider/profiles"
)

// RevocationEndpoint is where and how a provider revokes tokens (RFC 7009).
type RevocationEndpoint struct {
	URL          string // "": the provider has no revocation endpoint
	ClientID     string
	ClientSecret domain.Secret
	AuthStyle    oauth2.AuthStyle // auto: TokenURL's remembered style, else Basic; the other after a refusal
	TokenURL     string
	ClientKey    *clientkey.Key // private_key_jwt, for the token endpoint or, with IssuerAud, the issuer
	IssuerAud    *Discovery
}

// ProviderLookup reads a stored provider, its client secret opened; an error
// wraps domain.ErrUnknownProvider when there is none.
type ProviderLookup interface {
	Get(ctx context.Context, name string) (domain.Provider, error)
}

// endpoint is provider's endpoint ("" the environment's), the stored provider read
// for its current secret; an unknown name wraps domain.ErrUnknownProvider.
func (r *Revocations) endpoint(ctx context.Context, provider string) (RevocationEndpoint, error) {
	if provider == "" {
		return r.env, nil
	}
	if r.providers == nil {
		return RevocationEndpoint{}, fmt.Errorf("provider %q: %w", provider, domain.ErrUnknownProvider)
	}
	p, err := r.providers.Get(ctx, provider)
	if err != nil {
		return RevocationEndpoint{}, err
	}
	key, err := storedKey(p)
	if err != nil {
		return RevocationEndpoint{}, fmt.Errorf("provider %s: its client key: %w", provider, domain.ErrEndpointMisconfigured)
	}
	prof, _ := profiles.Get(p.Profile)
	return revocationEndpoint(p.RevocationURL, OAuth2Config(p), key, prof, r.discovery), nil
}

// revocationEndpoint is url, the client authenticated as at its token endpoint.
func revocationEndpoint(url string, cfg *oauth2.Config, key *clientkey.Key, prof profiles.Profile, d *Discovery) RevocationEndpoint {
	return RevocationEndpoint{URL: url, ClientID: cfg.ClientID, ClientSecret: domain.NewSecret(cfg.ClientSecret),
		AuthStyle: cfg.Endpoint.AuthStyle, TokenURL: cfg.Endpoint.TokenURL, ClientKey: key, IssuerAud: issuerFinder(key, prof, d)}
}

// Revocations revokes refresh tokens at their provider (RFC 7009); it is usecase.Revoker.
type Revocations struct {
	env       RevocationEndpoint
	providers ProviderLookup // nil: none
	discovery *Discovery
	client    *http.Client
	styles    AuthStyleStore // may be nil
}

// NewRevoker revokes at revocationURL ("" none) the refresh tokens of the client
// cfg registers (key, prof: see ClientOptions), and the stored providers' at
// their own; client should be bounded, styles may be nil.
func NewRevoker(cfg *oauth2.Config, revocationURL string, key *clientkey.Key, prof profiles.Profile,
	providers ProviderLookup, d *Discovery, client *http.Client, styles AuthStyleStore) *Revocations {
	return NewRevocations(revocationEndpoint(revocationURL, cfg, key, prof, d), providers, d, client, styles)
}

// NewRevocations revokes at env for "" and at providers' endpoints (d finds their issuers).
func NewRevocations(env RevocationEndpoint, providers ProviderLookup, d *Discovery, client *http.Client, styles AuthStyleStore) *Revocations {
	c := *client
	c.Transport = &dpop.TokenTransport{Base: c.Transport, Nonces: &dpop.Nonces{}}
	return &Revocations{env: env, providers: providers, discovery: d, client: &c, styles: styles}
}

// RevokeBound revokes a refresh token bound to key (PEM) with a DPoP proof.
func (r *Revocations) RevokeBound(ctx context.Context, provider string, refreshToken, key domain.Secret) error {
	ctx, err := proofKey(ctx, key)
	if err != nil {
		return err
	}
	return r.Revoke(ctx, provider, refreshToken)
}

var errRevocationRefused = errors.New("the revocation endpoint refused the request")

// Revoke revokes refreshToken; a token invalid already is a success too.
// Errors wrap a domain error or name the status and code, never the token.
func (r *Revocations) Revoke(ctx context.Context, provider string, refreshToken domain.Secret) error {
	e, err := r.endpoint(ctx, provider)
	if err != nil {
		return err
	}
	if e.URL == "" {
		name := "the provider of the OAUTH_* settings (OAUTH_REVOCATION_URL is not set)"
		if provider != "" {
			name = "provider " + provider + " (its revocation URL is not set: tokenctl provider update --revocation-url)"
		}
		return fmt.Errorf("%s: %w", name, domain.ErrNoRevocationEndpoint)
	}
	style, auto := e.AuthStyle, e.AuthStyle == oauth2.AuthStyleAutoDetect
	if auto && r.styles != nil && e.TokenURL != "" {
		if name, err := r.styles.Load(ctx, e.TokenURL, e.ClientID); err == nil {
			style = AuthStyleOf(name)
		}
	}
	style = cmp.Or(style, oauth2.AuthStyleInHeader) // a configured style is never 0
	status, code, err := r.send(ctx, e, style, refreshToken)
	if auto && err == nil && (status == http.StatusUnauthorized || code == "invalid_client") {
		status, code, err = r.send(ctx, e, other(style), refreshToken)
	}
	if err != nil {
		return fmt.Errorf("revocation endpoint unreachable: %w: %w", domain.ErrProviderUnavailable, err)
	}
	return revocationAnswer(status, code)
}

// revocationAnswer says what a revocation endpoint's answer means.
func revocationAnswer(status int, code string) error {
	what := fmt.Sprintf("revocation endpoint answered HTTP %d", status)
	if code != "" {
		what += " " + code
	}
	switch {
	case status >= 200 && status < 300, code == "invalid_grant", code == "invalid_token":
		return nil // some providers say with an error what RFC 7009 answers 200
	case status >= 300 && status < 400, status == http.StatusNotFound, status == http.StatusMethodNotAllowed:
		return fmt.Errorf("%s: %w (check the revocation URL)", what, domain.ErrEndpointMisconfigured)
	case status >= 500, status == http.StatusTooManyRequests, code == "temporarily_unavailable", code == "server_error":
		return fmt.Errorf("%s: %w", what, domain.ErrProviderUnavailable)
	case status == http.StatusUnauthorized, code == "invalid_client", code == "unauthorized_client":
		return fmt.Errorf("%s: %w", what, domain.ErrClientRejected)
	}
	return fmt.Errorf("%s: %w", what, errRevocationRefused)
}

// send posts one revocation request and returns the status and reported code.
func (r *Revocations) send(ctx context.Context, e RevocationEndpoint, style oauth2.AuthStyle, token domain.Secret) (int, string, error) {
	form := url.Values{"token": {token.Reveal()}, "token_type_hint": {"refresh_token"}}
	c := clientAuth{id: e.ClientID, secret: e.ClientSecret.Reveal(), key: e.ClientKey, tokenURL: e.TokenURL,
		issuer: e.IssuerAud, hc: r.client, now: time.Now}
	a, pe := c.post(ctx, e.URL, form, style, false)
	switch {
	case pe != nil && pe.Class == domain.EndpointMisconfigured:
		return 0, "", fmt.Errorf("revocation URL: %w", errRevocationRefused)
	case pe != nil && a.status == 0:
		return 0, "", pe.Err // *url.Error: the method and URL, never the form
	}
	code := a.fields.str("error")
	if code != "unsupported_token_type" { // RFC 7009 §2.2.1
		code = reportedCode(code)
	}
	return a.status, code, nil
}
