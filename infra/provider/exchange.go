package provider

import (
	"context"
	"encoding/json"
	"maps"
	"net/url"
	"slices"
	"strings"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/provider/profiles"
)

// Exchange redeems an authorization code (RFC 6749 §4.1.3, PKCE) as
// refreshes are sent and read. The token shows every answer field in Extra.
// Errors are *domain.ProviderError, free of secrets.
func (r *Refresher) Exchange(ctx context.Context, code, redirectURL, verifier string) (domain.Grant, *oauth2.Token, error) {
	form := url.Values{"grant_type": {"authorization_code"}, "code": {code}}
	if redirectURL != "" {
		form.Set("redirect_uri", redirectURL)
	}
	if verifier != "" {
		form.Set("code_verifier", verifier)
	}
	var g domain.Grant
	var tok *oauth2.Token
	pe := r.authenticated(ctx, false, func(style oauth2.AuthStyle) (pe *domain.ProviderError) {
		g, tok, pe = r.redeem(ctx, form, style)
		return pe
	})
	if pe != nil {
		return domain.Grant{}, nil, pe
	}
	return g, tok, nil
}

// redeem sends one code grant request in style and reads the answer.
func (r *Refresher) redeem(ctx context.Context, form url.Values, style oauth2.AuthStyle) (domain.Grant, *oauth2.Token, *domain.ProviderError) {
	a, pe := r.post(ctx, r.cfg.Endpoint.TokenURL, maps.Clone(form), style, false)
	if pe != nil {
		return domain.Grant{}, nil, pe
	}
	g, pe := r.judge(a)
	if pe != nil {
		return domain.Grant{}, nil, pe
	}
	if g.RefreshExpiry.IsZero() && r.refreshAbsolute > 0 {
		g.RefreshExpiry = a.sent.Add(r.refreshAbsolute) // the grant's calendar starts at the consent
	}
	f, _ := parseAnswer(a.header.Get("Content-Type"), a.body)
	raw := make(map[string]any, len(f))
	for k, v := range f {
		var x any
		if json.Unmarshal(v, &x) == nil {
			raw[k] = x
		}
	}
	tok := &oauth2.Token{AccessToken: g.AccessToken.Reveal(), TokenType: g.TokenType,
		RefreshToken: g.RefreshToken.Reveal(), Expiry: g.Expiry}
	return g, tok.WithExtra(raw), nil
}

// Exchange redeems an authorization code at provider ("" the configuration's).
func (r *Registry) Exchange(ctx context.Context, provider, code, redirectURL, verifier string) (domain.Grant, *oauth2.Token, error) {
	ref, err := r.refresher(ctx, provider, "redeem authorization codes")
	if err != nil {
		return domain.Grant{}, nil, err
	}
	return ref.Exchange(ctx, code, redirectURL, verifier)
}

// SetProfile is the configuration's provider's profile; call it before use.
func (r *Registry) SetProfile(p profiles.Profile) { r.envProfile = p }

func (r *Registry) profile(provider string) profiles.Profile {
	if provider == "" {
		return r.envProfile
	}
	p, _ := profiles.Get(r.all()[provider].p.Profile)
	return p
}

// AuthCodeOptions are the authorization parameters provider's profile adds,
// and scopes joined with its separator where it is not a space.
func (r *Registry) AuthCodeOptions(provider string, scopes []string) []oauth2.AuthCodeOption {
	p := r.profile(provider)
	var out []oauth2.AuthCodeOption
	for _, k := range slices.Sorted(maps.Keys(p.AuthParams)) {
		out = append(out, oauth2.SetAuthURLParam(k, p.AuthParams[k]))
	}
	if p.ScopeSeparator != "" && p.ScopeSeparator != " " && len(scopes) > 0 {
		out = append(out, oauth2.SetAuthURLParam("scope", strings.Join(scopes, p.ScopeSeparator)))
	}
	return out
}

// ProviderFields is the connection metadata of a first grant: g.Extra and
// the profile's fields of the callback query; nil when there are none.
func (r *Registry) ProviderFields(provider string, callback url.Values, g domain.Grant) map[string]string {
	out := maps.Clone(g.Extra)
	for _, k := range r.profile(provider).CallbackFields {
		if v := callback.Get(k); v != "" {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}
