package tokenguard

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/clientkey"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/infra/provider/profiles"
)

// storedAuth are the token request options of stored provider p (profile
// pp). A client key that cannot be read is left out: the provider then
// refuses the client, and no grant is touched.
func (t *Tokens) storedAuth(p domain.Provider, pp profiles.Profile) []provider.Option {
	var key *clientkey.Key
	if !p.ClientKey.IsZero() {
		if k, err := clientkey.ParsePEM([]byte(p.ClientKey.Reveal())); err == nil {
			key = k
		}
	}
	return t.authOptions(p.Resource, key, pp)
}

// authOptions are the token request options of a provider with resource
// indicator resource and private_key_jwt key (nil for none) under profile prof.
func (t *Tokens) authOptions(resource string, key *clientkey.Key, prof profiles.Profile) []provider.Option {
	var out []provider.Option
	if resource != "" {
		out = append(out, provider.WithResource(resource))
	}
	if key != nil {
		out = append(out, provider.WithClientKey(key, ""))
		if prof.AssertionAud == domain.AudienceIssuer {
			out = append(out, provider.WithIssuerAudience(t.discovery))
		}
	}
	return out
}

// parOf is f's provider's PAR mode and resource indicator.
func (t *Tokens) parOf(f ConnectFlow) (domain.PARMode, string) {
	if f.Provider == "" {
		return t.par, t.resource
	}
	p, _ := t.providers.Provider(f.Provider)
	mode, err := domain.ParsePARMode(string(p.PAR))
	if err != nil {
		mode = domain.PARAuto // written by a newer release
	}
	return mode, p.Resource
}

// pushed pushes the authorization request authURL when f's provider wants
// it pushed (RFC 9126), and returns the URL the browser goes to.
func (t *Tokens) pushed(ctx context.Context, f ConnectFlow, client *oauth2.Config, authURL string) (string, error) {
	mode, _ := t.parOf(f)
	if mode == domain.PARNever {
		return authURL, nil
	}
	m, found := t.discovery.Find(ctx, client.Endpoint.TokenURL)
	endpoint, err := provider.PAREndpoint(mode, t.providers.PARRequired(f.Provider), m, found)
	if err != nil {
		return "", fmt.Errorf("tokenguard: AuthCodeURL: %w", err)
	}
	if endpoint == "" {
		return authURL, nil
	}
	u, err := url.Parse(authURL)
	if err != nil {
		return "", fmt.Errorf("tokenguard: AuthCodeURL: the authorization URL: %w", domain.ErrInvalidProvider)
	}
	uri, err := t.providers.Push(ctx, f.Provider, endpoint, u.Query())
	if err != nil {
		return "", fmt.Errorf("tokenguard: AuthCodeURL: pushed authorization request: %w", err)
	}
	base, _, _ := strings.Cut(client.Endpoint.AuthURL, "?")
	return base + "?" + url.Values{"client_id": {client.ClientID}, "request_uri": {uri}}.Encode(), nil
}
