package provider

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"strings"
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
	// AuthStyle authenticates the client as at the token endpoint; in auto
	// the style remembered for TokenURL, else HTTP Basic, and the other
	// once after invalid_client or a 401 (a revocation is idempotent).
	AuthStyle oauth2.AuthStyle
	TokenURL  string // where the remembered style was learned
	// ClientKey: the client authenticates with private_key_jwt, an
	// assertion whose audience is the token endpoint or, with IssuerAud,
	// the issuer of the provider's metadata.
	ClientKey *clientkey.Key
	IssuerAud *Discovery
}

// RevocationEndpoints finds the revocation endpoint of a provider by name
// ("" is the provider of the environment). A name it does not know is an
// error wrapping domain.ErrUnknownProvider.
type RevocationEndpoints interface {
	RevocationEndpointFor(ctx context.Context, provider string) (RevocationEndpoint, error)
}

// OneRevocationEndpoint is the revocation endpoint of the provider of the
// environment, the only provider it knows.
type OneRevocationEndpoint RevocationEndpoint

// RevocationEndpointFor implements RevocationEndpoints.
func (e OneRevocationEndpoint) RevocationEndpointFor(_ context.Context, provider string) (RevocationEndpoint, error) {
	if provider != "" {
		return RevocationEndpoint{}, fmt.Errorf("provider %q: %w", provider, domain.ErrUnknownProvider)
	}
	return RevocationEndpoint(e), nil
}

// ProviderLookup reads a stored provider, its client secret opened; an
// error wraps domain.ErrUnknownProvider when there is none.
type ProviderLookup interface {
	Get(ctx context.Context, name string) (domain.Provider, error)
}

// StoredRevocationEndpoints serves "" with Env and any other name with
// that stored provider's revocation URL, read when asked: a revocation is
// rare, and it then uses the current client secret.
type StoredRevocationEndpoints struct {
	Env       RevocationEndpoint
	Providers ProviderLookup
	Discovery *Discovery // for a profile whose assertions name the issuer
}

// RevocationEndpointFor implements RevocationEndpoints.
func (s StoredRevocationEndpoints) RevocationEndpointFor(ctx context.Context, provider string) (RevocationEndpoint, error) {
	if provider == "" {
		return s.Env, nil
	}
	p, err := s.Providers.Get(ctx, provider)
	if err != nil {
		return RevocationEndpoint{}, err
	}
	cfg := OAuth2Config(p)
	e := RevocationEndpoint{URL: p.RevocationURL, ClientID: p.ClientID, ClientSecret: p.ClientSecret,
		AuthStyle: cfg.Endpoint.AuthStyle, TokenURL: p.TokenURL}
	if !p.ClientKey.IsZero() {
		if e.ClientKey, err = clientkey.ParsePEM([]byte(p.ClientKey.Reveal())); err != nil {
			return RevocationEndpoint{}, fmt.Errorf("provider %s: its client key: %w", provider, domain.ErrEndpointMisconfigured)
		}
		if prof, _ := profiles.Get(p.Profile); prof.AssertionAud == domain.AudienceIssuer {
			e.IssuerAud = s.Discovery
		}
	}
	return e, nil
}

// Revocations revokes refresh tokens at their provider's revocation
// endpoint: POST token=…&token_type_hint=refresh_token with the client's
// authentication (RFC 7009 §2.1). It is usecase.Revoker.
type Revocations struct {
	endpoints RevocationEndpoints
	client    *http.Client
	styles    AuthStyleStore // may be nil
}

// NewRevocations builds the revoker; client should be bounded
// (NewHTTPClient); styles (may be nil) are those learned at token endpoints.
func NewRevocations(endpoints RevocationEndpoints, client *http.Client, styles AuthStyleStore) *Revocations {
	c := *client
	// Revocations of a DPoP-bound grant carry a proof of its key.
	c.Transport = &dpop.TokenTransport{Base: c.Transport, Nonces: &dpop.Nonces{}}
	return &Revocations{endpoints: endpoints, client: &c, styles: styles}
}

// RevokeBound revokes a refresh token bound to key (PEM): the request
// carries a DPoP proof signed with it, as the grant's token requests do.
func (r *Revocations) RevokeBound(ctx context.Context, provider string, refreshToken, key domain.Secret) error {
	ctx, err := proofKey(ctx, key)
	if err != nil {
		return err
	}
	return r.Revoke(ctx, provider, refreshToken)
}

// errRevocationRefused: a failure without a more precise meaning.
var errRevocationRefused = errors.New("the revocation endpoint refused the request")

// Revoke revokes refreshToken at provider's revocation endpoint; an answer
// that the token is invalid already is a success too. Errors wrap
// domain.ErrNoRevocationEndpoint, ErrUnknownProvider, ErrProviderUnavailable
// (try again), ErrClientRejected or ErrEndpointMisconfigured, or name the
// status and the code; never the token or the body.
func (r *Revocations) Revoke(ctx context.Context, provider string, refreshToken domain.Secret) error {
	e, err := r.endpoints.RevocationEndpointFor(ctx, provider)
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
	if auto {
		style = oauth2.AuthStyleInHeader
		if r.styles != nil && e.TokenURL != "" {
			if name, err := r.styles.Load(ctx, e.TokenURL, e.ClientID); err == nil && styleFromName(name) != oauth2.AuthStyleAutoDetect {
				style = styleFromName(name)
			}
		}
	}
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
	case status >= 200 && status < 300:
		return nil
	case code == "invalid_grant" || code == "invalid_token":
		// RFC 7009 §2.2 answers 200 for an invalid token; some providers
		// say it with an error. Either way no grant is left behind it.
		return nil
	case status >= 300 && status < 400, status == http.StatusNotFound, status == http.StatusMethodNotAllowed:
		return fmt.Errorf("%s: %w (check the revocation URL)", what, domain.ErrEndpointMisconfigured)
	case status >= 500, status == http.StatusTooManyRequests, code == "temporarily_unavailable", code == "server_error":
		return fmt.Errorf("%s: %w", what, domain.ErrProviderUnavailable)
	case status == http.StatusUnauthorized, code == "invalid_client", code == "unauthorized_client":
		return fmt.Errorf("%s: %w", what, domain.ErrClientRejected)
	}
	return fmt.Errorf("%s: %w", what, errRevocationRefused)
}

// send posts one revocation request and returns the status and the error
// code of the answer, unknown codes not echoed.
func (r *Revocations) send(ctx context.Context, e RevocationEndpoint, style oauth2.AuthStyle, token domain.Secret) (int, string, error) {
	form := url.Values{"token": {token.Reveal()}, "token_type_hint": {"refresh_token"}}
	var req *http.Request
	var err error
	if e.ClientKey != nil {
		req, err = assertedRequest(ctx, e, form)
	} else {
		req, err = clientRequest(ctx, e.URL, form, e.ClientID, e.ClientSecret.Reveal(), style)
	}
	if err != nil {
		return 0, "", fmt.Errorf("revocation URL: %w", errRevocationRefused)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return 0, "", err // *url.Error: the method and URL, never the form
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	code := ""
	if f, ok := parseAnswer(resp.Header.Get("Content-Type"), body); ok {
		if code = f.str("error"); code != "unsupported_token_type" { // RFC 7009 §2.2.1
			code = reportedCode(code)
		}
	}
	return resp.StatusCode, code, nil
}

// assertedRequest is a revocation request authenticated with a client
// assertion (private_key_jwt), as the token requests are.
func assertedRequest(ctx context.Context, e RevocationEndpoint, form url.Values) (*http.Request, error) {
	aud := e.TokenURL
	if e.IssuerAud != nil {
		m, ok := e.IssuerAud.Find(ctx, e.TokenURL)
		if !ok {
			return nil, errNoIssuer
		}
		aud = m.Issuer
	}
	form.Set("client_id", e.ClientID)
	form.Set("client_assertion_type", clientkey.AssertionType)
	encode := func() (string, error) {
		assertion, err := e.ClientKey.Assertion(e.ClientID, aud, time.Now())
		if err != nil {
			return "", err
		}
		f := maps.Clone(form)
		f.Set("client_assertion", assertion)
		return f.Encode(), nil
	}
	first, err := encode()
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.URL, strings.NewReader(first))
	if err != nil {
		return nil, err
	}
	// A copy sent again (with a DPoP nonce) carries an assertion of its
	// own, of the same length: a jti is never presented twice.
	req.GetBody = func() (io.ReadCloser, error) {
		b, err := encode()
		return io.NopCloser(strings.NewReader(b)), err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	return req, nil
}
