package provider

import (
	"context"
	"errors"
	"io"
	"maps"
	"net/http"
	"net/url"
	"strings"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/infra/clientkey"
)

// WithClientKey authenticates the client with private_key_jwt (RFC 7523
// §2.2): every token request carries a fresh assertion signed with k, for
// audience ("" is the token endpoint), instead of the client secret.
func WithClientKey(k *clientkey.Key, audience string) Option {
	return func(r *Refresher) { r.clientKey, r.assertionAud = k, audience }
}

// WithIssuerAudience makes the assertions' audience the issuer named by
// the provider's metadata (found by d) instead of the token endpoint, as
// the provider's profile says (assertion_aud: issuer).
func WithIssuerAudience(d *Discovery) Option { return func(r *Refresher) { r.issuerAud = d } }

// errNoIssuer: the assertions' audience is the issuer, and the provider's
// metadata, which names it, cannot be read.
var errNoIssuer = errors.New("the provider's metadata, whose issuer is the client assertions' audience, cannot be read")

// WithResource names the resource server (RFC 8707) on every token
// request: the access tokens are for it.
func WithResource(resource string) Option { return func(r *Refresher) { r.resource = resource } }

// request is a token request with form: with a client assertion when the
// client authenticates with a key, else with the secret in style; with
// the resource indicator when there is one.
func (r *Refresher) request(ctx context.Context, form url.Values, style oauth2.AuthStyle) (*http.Request, error) {
	return r.requestTo(ctx, r.cfg.Endpoint.TokenURL, form, style)
}

// requestTo is request sent to endpoint (the token endpoint, or the
// pushed authorization request endpoint, which authenticates the client
// alike).
func (r *Refresher) requestTo(ctx context.Context, endpoint string, form url.Values, style oauth2.AuthStyle) (*http.Request, error) {
	if r.resource != "" {
		form.Set("resource", r.resource)
	}
	if r.clientKey == nil {
		return clientRequest(ctx, endpoint, form, r.cfg.ClientID, r.cfg.ClientSecret, style)
	}
	aud := r.assertionAud
	if aud == "" {
		aud = r.cfg.Endpoint.TokenURL
	}
	if r.issuerAud != nil {
		m, ok := r.issuerAud.Find(ctx, r.cfg.Endpoint.TokenURL)
		if !ok {
			return nil, errNoIssuer
		}
		aud = m.Issuer
	}
	form.Set("client_id", r.cfg.ClientID)
	form.Set("client_assertion_type", clientkey.AssertionType)
	// Each body carries an assertion of its own: a copy sent again (the
	// retry with a DPoP nonce) must not repeat the jti, which servers
	// refuse as a replay.
	// An assertion's length depends only on the client id, the audience
	// and the key: every copy has the first one's Content-Length.
	body := func() (io.ReadCloser, error) {
		assertion, err := r.clientKey.Assertion(r.cfg.ClientID, aud, r.now())
		if err != nil {
			return nil, err
		}
		f := maps.Clone(form)
		f.Set("client_assertion", assertion)
		return io.NopCloser(strings.NewReader(f.Encode())), nil
	}
	first, err := body()
	if err != nil {
		return nil, err
	}
	encoded, _ := io.ReadAll(first)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(string(encoded)))
	if err != nil {
		return nil, err
	}
	req.GetBody = body
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	return req, nil
}
