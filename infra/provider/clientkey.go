package provider

import (
	"cmp"
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

// requestTo is a request with form to endpoint (the token or the PAR
// endpoint), the client authenticated as configured, with the resource
// indicator when there is one.
func (r *Refresher) requestTo(ctx context.Context, endpoint string, form url.Values, style oauth2.AuthStyle) (*http.Request, error) {
	if r.resource != "" {
		form.Set("resource", r.resource)
	}
	c := clientAuth{id: r.cfg.ClientID, secret: r.cfg.ClientSecret, key: r.clientKey, aud: r.assertionAud,
		tokenURL: r.cfg.Endpoint.TokenURL, issuer: r.issuerAud, now: r.now}
	return c.request(ctx, endpoint, form, style)
}

// clientAuth is how a client authenticates at its provider's endpoints.
type clientAuth struct {
	id, secret string
	key        *clientkey.Key // private_key_jwt when set
	aud        string         // the assertions' audience; "" the token URL
	tokenURL   string
	issuer     *Discovery // when set, the audience is the issuer its metadata names
	now        func() time.Time
}

// request is a form POST to endpoint, the client authenticated with an
// assertion when it has a key, else with its secret in style.
func (c clientAuth) request(ctx context.Context, endpoint string, form url.Values, style oauth2.AuthStyle) (*http.Request, error) {
	if c.key == nil {
		if style == oauth2.AuthStyleInParams {
			form.Set("client_id", c.id)
			if c.secret != "" {
				form.Set("client_secret", c.secret)
			}
		}
		req, err := formPost(ctx, endpoint, form.Encode())
		if err == nil && style == oauth2.AuthStyleInHeader {
			// RFC 6749 §2.3.1: both are form-encoded before Basic encoding.
			req.SetBasicAuth(url.QueryEscape(c.id), url.QueryEscape(c.secret))
		}
		return req, err
	}
	aud := cmp.Or(c.aud, c.tokenURL)
	if c.issuer != nil {
		m, ok := c.issuer.Find(ctx, c.tokenURL)
		if !ok {
			return nil, errNoIssuer
		}
		aud = m.Issuer
	}
	form.Set("client_id", c.id)
	form.Set("client_assertion_type", clientkey.AssertionType)
	// Each copy of the body (a resend with a DPoP nonce) has an assertion of
	// its own, of the same length: servers refuse a repeated jti as a replay.
	encode := func() (string, error) {
		assertion, err := c.key.Assertion(c.id, aud, c.now())
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
	req, err := formPost(ctx, endpoint, first)
	if err != nil {
		return nil, err
	}
	req.GetBody = func() (io.ReadCloser, error) {
		b, err := encode()
		return io.NopCloser(strings.NewReader(b)), err
	}
	return req, nil
}

func formPost(ctx context.Context, endpoint, body string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	return req, nil
}
