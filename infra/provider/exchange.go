package provider

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/provider/profiles"
)

// Exchange redeems an authorization code (RFC 6749 §4.1.3, PKCE) as refreshes are
// sent and read; the token shows every answer field in Extra. Errors are
// *domain.ProviderError, free of secrets.
func (r *Refresher) Exchange(ctx context.Context, code, redirectURL, verifier string) (domain.Grant, *oauth2.Token, error) {
	form := url.Values{"grant_type": {"authorization_code"}, "code": {code}}
	if redirectURL != "" {
		form.Set("redirect_uri", redirectURL)
	}
	if verifier != "" {
		form.Set("code_verifier", verifier)
	}
	var a answer
	var g domain.Grant
	_, pe := r.authenticated(ctx, false, func(style oauth2.AuthStyle) (pe *domain.ProviderError) {
		a, g, pe = r.exchange(ctx, form, style, false)
		return pe
	})
	if pe != nil {
		return domain.Grant{}, nil, pe
	}
	if g.RefreshExpiry.IsZero() && r.profile.RefreshAbsolute.D > 0 {
		g.RefreshExpiry = a.sent.Add(r.profile.RefreshAbsolute.D) // the grant's calendar starts at the consent
	}
	raw := make(map[string]any, len(a.fields))
	for k, v := range a.fields {
		var x any
		if json.Unmarshal(v, &x) == nil {
			raw[k] = x
		}
	}
	tok := &oauth2.Token{AccessToken: g.AccessToken.Reveal(), TokenType: g.TokenType,
		RefreshToken: g.RefreshToken.Reveal(), Expiry: g.Expiry}
	return g, tok.WithExtra(raw), nil
}

// Exchange redeems an authorization code at provider ("" the configuration's); with a DPoP key
// (PEM; zero: none) every request carries a proof of it, binding the grant to it (RFC 9449).
func (r *Registry) Exchange(ctx context.Context, provider, code, redirectURL, verifier string, key domain.Secret) (domain.Grant, *oauth2.Token, error) {
	if !key.IsZero() {
		var err error
		if ctx, err = proofKey(ctx, key); err != nil {
			return domain.Grant{}, nil, err
		}
	}
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

// AuthCodeOptions are the authorization parameters provider's profile adds, and
// scopes joined with its separator where it is not a space.
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
	return collect(maps.Clone(g.Extra), r.profile(provider).CallbackFields, callback.Get)
}

// PAREndpoint says where the connect flow pushes its authorization request
// (RFC 9126), "" when it is not pushed; auto pushes when the metadata or the
// profile requires it. Required without an endpoint is ErrNoPAREndpoint.
func PAREndpoint(mode domain.PARMode, profileRequires bool, m Metadata, found bool) (string, error) {
	required := profileRequires || found && m.RequirePAR
	if mode == domain.PARNever || mode != domain.PARAlways && !required {
		return "", nil
	}
	if !found || m.PAREndpoint == "" {
		return "", domain.ErrNoPAREndpoint
	}
	return m.PAREndpoint, nil
}

var errPushRefused = errors.New("the pushed authorization request endpoint answered without a request_uri")

// Push sends the authorization request form to endpoint (RFC 9126 §2.1), the
// client authenticated as at the token endpoint, and returns the request_uri.
// Errors are *domain.ProviderError naming only the status and code.
func (r *Refresher) Push(ctx context.Context, endpoint string, form url.Values) (string, error) {
	var uri string
	_, pe := r.authenticated(ctx, false, func(style oauth2.AuthStyle) *domain.ProviderError {
		a, pe := r.auth.post(ctx, endpoint, maps.Clone(form), style, false)
		if pe != nil && a.status == 0 {
			return pe
		}
		if a.status == http.StatusCreated || a.status == http.StatusOK {
			if uri = a.fields.str("request_uri"); uri == "" {
				return &domain.ProviderError{HTTPStatus: a.status, Class: domain.EndpointMisconfigured, Err: errPushRefused}
			}
			return nil
		}
		pe = &domain.ProviderError{HTTPStatus: a.status, Code: reportedCode(a.fields.str("error")), Class: domain.EndpointMisconfigured,
			Err: fmt.Errorf("pushed authorization request: HTTP %d", a.status)}
		if pe.Code == "invalid_client" || a.status == http.StatusUnauthorized {
			pe.Class = domain.ClientRejected
		}
		return pe
	})
	if pe != nil {
		return "", pe
	}
	return uri, nil
}

// Push pushes an authorization request for provider ("" the configuration's).
func (r *Registry) Push(ctx context.Context, provider, endpoint string, form url.Values) (string, error) {
	ref, err := r.refresher(ctx, provider, "push authorization requests")
	if err != nil {
		return "", err
	}
	return ref.Push(ctx, endpoint, form)
}

// PARRequired reports whether provider's profile requires pushed requests.
func (r *Registry) PARRequired(provider string) bool { return r.profile(provider).PAR == "required" }
