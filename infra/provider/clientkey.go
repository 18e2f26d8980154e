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

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/clientkey"
	"github.com/tokenguard/tokenguard/infra/provider/profiles"
)

var errNoIssuer = errors.New("the provider's metadata, whose issuer is the client assertions' audience, cannot be read")

// ClientOptions are the token request options of a client with resource
// indicator resource ("" none) and private_key_jwt key (nil none) under
// profile prof; d finds the issuer when prof makes it the assertions' audience.
func ClientOptions(resource string, key *clientkey.Key, prof profiles.Profile, d *Discovery) []Option {
	return []Option{func(r *Refresher) {
		r.auth.resource, r.auth.key, r.auth.issuer = resource, key, issuerFinder(key, prof, d)
	}}
}

// StoredClientOptions are ClientOptions of stored provider p (profile
// prof). A client key that cannot be read is left out: the provider then
// refuses the client, and no grant is touched.
func StoredClientOptions(p domain.Provider, prof profiles.Profile, d *Discovery) []Option {
	key, _ := storedKey(p)
	return ClientOptions(p.Resource, key, prof, d)
}

// storedKey is p's private_key_jwt key; nil when it has none.
func storedKey(p domain.Provider) (*clientkey.Key, error) {
	if p.ClientKey.IsZero() {
		return nil, nil
	}
	return clientkey.ParsePEM([]byte(p.ClientKey.Reveal()))
}

// issuerFinder is d when prof sends a keyed client's assertions to the issuer.
func issuerFinder(key *clientkey.Key, prof profiles.Profile, d *Discovery) *Discovery {
	if key != nil && prof.AssertionAud == domain.AudienceIssuer {
		return d
	}
	return nil
}

// clientAuth is how a client's requests reach its provider's endpoints.
type clientAuth struct {
	id, secret string
	key        *clientkey.Key // private_key_jwt when set
	tokenURL   string         // the assertions' audience, unless issuer is set
	issuer     *Discovery     // when set, the audience is the issuer its metadata names
	resource   string         // RFC 8707; "" none
	hc         *http.Client
	now        func() time.Time
}

// request is a form POST to endpoint, the client authenticated with an assertion
// when it has a key, else with its secret in style.
func (c clientAuth) request(ctx context.Context, endpoint string, form url.Values, style oauth2.AuthStyle) (*http.Request, error) {
	if c.resource != "" {
		form.Set("resource", c.resource)
	}
	encode := func() (string, error) { return form.Encode(), nil }
	if c.key != nil {
		aud := c.tokenURL
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
		encode = func() (string, error) {
			assertion, err := c.key.Assertion(c.id, aud, c.now())
			if err != nil {
				return "", err
			}
			f := maps.Clone(form)
			f.Set("client_assertion", assertion)
			return f.Encode(), nil
		}
	} else if style == oauth2.AuthStyleInParams {
		form.Set("client_id", c.id)
		if c.secret != "" {
			form.Set("client_secret", c.secret)
		}
	}
	body, err := encode()
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	req.GetBody = func() (io.ReadCloser, error) {
		b, err := encode()
		return io.NopCloser(strings.NewReader(b)), err
	}
	if c.key == nil && style == oauth2.AuthStyleInHeader {
		// RFC 6749 §2.3.1: both are form-encoded before Basic encoding.
		req.SetBasicAuth(url.QueryEscape(c.id), url.QueryEscape(c.secret))
	}
	return req, nil
}
