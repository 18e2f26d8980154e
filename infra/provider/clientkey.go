package provider

import (
	"context"
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

// WithResource names the resource server (RFC 8707) on every token
// request: the access tokens are for it.
func WithResource(resource string) Option { return func(r *Refresher) { r.resource = resource } }

// request is a token request with form: with a client assertion when the
// client authenticates with a key, else with the secret in style; with
// the resource indicator when there is one.
func (r *Refresher) request(ctx context.Context, form url.Values, style oauth2.AuthStyle) (*http.Request, error) {
	if r.resource != "" {
		form.Set("resource", r.resource)
	}
	if r.clientKey == nil {
		return clientRequest(ctx, r.cfg.Endpoint.TokenURL, form, r.cfg.ClientID, r.cfg.ClientSecret, style)
	}
	aud := r.assertionAud
	if aud == "" {
		aud = r.cfg.Endpoint.TokenURL
	}
	assertion, err := r.clientKey.Assertion(r.cfg.ClientID, aud, r.now())
	if err != nil {
		return nil, err
	}
	form.Set("client_id", r.cfg.ClientID)
	form.Set("client_assertion_type", clientkey.AssertionType)
	form.Set("client_assertion", assertion)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.cfg.Endpoint.TokenURL, strings.NewReader(form.Encode()))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	return req, nil
}
