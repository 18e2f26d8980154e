package tokenguard

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/provider"
)

// parOf is f's provider's PAR mode and resource indicator.
func (t *Tokens) parOf(f ConnectFlow) (domain.PARMode, string) {
	if f.Provider == "" {
		return t.o.par, t.o.resource
	}
	p, _ := t.providers.Provider(f.Provider)
	return p.PAR, p.Resource // "" or a newer release's mode reads as auto
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
