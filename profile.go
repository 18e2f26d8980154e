package tokenguard

import (
	"cmp"
	"errors"
	"fmt"
	"strings"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/infra/provider/profiles"
)

// WithProfile applies the provider profile called name to New's oauth2.Config,
// filling what the config and options leave unset. An unknown name is ErrUnknownProfile.
func WithProfile(name string) Option { return func(o *options) { o.profile = name } }

// WithProfileParam fills the {key} placeholder of the profile's URLs
// (Okta's domain, say); a parameter the profile does not take makes New fail.
func WithProfileParam(key, value string) Option {
	return func(o *options) { o.profileParams[key] = value }
}

// applyProfile returns a copy of cfg completed by o's profile, the profile,
// and the default lifetime of cfg's access tokens.
func applyProfile(cfg *oauth2.Config, o *options) (_ *oauth2.Config, _ profiles.Profile, lifetime time.Duration, _ error) {
	p, err := profiles.Get(o.profile)
	if err != nil {
		return nil, profiles.Profile{}, 0, fmt.Errorf("tokenguard: WithProfile: %w", err)
	}
	if cfg == nil {
		return nil, p, 0, nil
	}
	out := *cfg
	u, err := p.Complete(profiles.URLs{Token: out.Endpoint.TokenURL, Auth: out.Endpoint.AuthURL, Revocation: o.revocationURL}, o.profileParams)
	if miss, ok := errors.AsType[*profiles.MissingParamError](err); ok {
		return nil, p, 0, fmt.Errorf("tokenguard: WithProfile(%q) needs WithProfileParam for %s: %w", p.Name, strings.Join(miss.Params, ", "), err)
	} else if err != nil {
		return nil, p, 0, fmt.Errorf("tokenguard: WithProfile(%q): %w", p.Name, err)
	}
	// A token URL given by the caller keeps the caller's style (auto cannot be told from unset).
	if out.Endpoint.TokenURL == "" && out.Endpoint.AuthStyle == oauth2.AuthStyleAutoDetect {
		out.Endpoint.AuthStyle = provider.AuthStyleOf(string(p.AuthStyle))
	}
	out.Endpoint.TokenURL, out.Endpoint.AuthURL, o.revocationURL = u.Token, u.Auth, u.Revocation
	return &out, p, cmp.Or(o.defaultLifetime, p.AccessLifetime.D), nil // D is zero unless Known
}
