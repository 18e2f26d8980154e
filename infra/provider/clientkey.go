package provider

import (
	"context"
	"errors"
	"io"
	"maps"
	"net/http"
	"net/url"
	"strings"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/infra/clientkey"
)

// WithClientKey authenticates the client with private_key_jwt (RFC 7523
// §2.2): a fresh assertion signed with k for audience ("" the token URL).
func WithClientKey(k *clientkey.Key, audience string) Option {
	return func(r *Refresher) { r.clientKey, r.assertionAud = k, audience }
}

// WithIssuerAudience makes the assertions' audience the issuer named by the
// provider's metadata (found by d), as profiles with assertion_aud: issuer say.
func WithIssuerAudience(d *Discovery) Option { return func(r *Refresher) { r.issuerAud = d } }

var errNoIssuer = errors.New("the provider's metadata, whose issuer is the client assertions' audience, cannot be read")

// WithResource names the resource server (RFC 8707) on every token request.
func WithResource(resource string) Option { return func(r *Refresher) { r.resource = resource } }

// request is a token request with form, authenticated as the client is
// configured, with the resource indicator when there is one.
func (r *Refresher) request(ctx context.Context, form url.Values, style oauth2.AuthStyle) (*http.Request, error) {
	return r.requestTo(ctx, r.cfg.Endpoint.TokenURL, form, style)
}

// requestTo is request sent to endpoint (the token or the PAR endpoint).
func (r *Refresher) requestTo(ctx context.Context, endpoint string, form url.Values, style oauth2.AuthStyle) (*http.Request, error) {
	if r.resource != "" {
		form.Set("resource", r.resource)
	}
	if r.clientKey == nil {
		return clientRequest(ctx, endpoint, form, r.cfg.ClientID, r.cfg.ClientSecret, style)
	}
	aud, err := assertionAudience(ctx, r.assertionAud, r.cfg.Endpoint.TokenURL, r.issuerAud)
	if err != nil {
		return nil, err
	}
	return assertedRequest(ctx, endpoint, form, r.cfg.ClientID, r.clientKey, aud, r.now)
}

// assertionAudience is aud ("" the token endpoint) or, with issuer, the
// issuer named by the provider's metadata.
func assertionAudience(ctx context.Context, aud, tokenURL string, issuer *Discovery) (string, error) {
	if issuer != nil {
		m, ok := issuer.Find(ctx, tokenURL)
		if !ok {
			return "", errNoIssuer
		}
		return m.Issuer, nil
	}
	if aud == "" {
		return tokenURL, nil
	}
	return aud, nil
}

// assertedRequest is a form POST to endpoint authenticated with a client
// assertion (private_key_jwt). Each copy of the body (a resend with a DPoP
// nonce) has an assertion of its own, of the same length: servers refuse a
// repeated jti as a replay.
func assertedRequest(ctx context.Context, endpoint string, form url.Values, clientID string,
	key *clientkey.Key, aud string, now func() time.Time) (*http.Request, error) {
	form.Set("client_id", clientID)
	form.Set("client_assertion_type", clientkey.AssertionType)
	encode := func() (string, error) {
		assertion, err := key.Assertion(clientID, aud, now())
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
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(first))
	if err != nil {
		return nil, err
	}
	req.GetBody = func() (io.ReadCloser, error) {
		b, err := encode()
		return io.NopCloser(strings.NewReader(b)), err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	return req, nil
}
