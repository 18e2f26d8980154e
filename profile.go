package tokenguard

import (
	"fmt"
	"strings"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/provider/profiles"
)

// WithProfile applies the provider profile called name (tokenctl provider
// profiles lists them) to the provider of New's oauth2.Config: the
// provider's own codes for a dead grant (GitHub's bad_refresh_token in a
// 200 body) and the answer fields it keeps; and, for what the
// oauth2.Config and the other options leave unset, its token URL (with
// its client authentication style), authorization and revocation URLs and
// access token lifetime. What they set wins (GitHub Enterprise, a
// sandbox, tests). An unknown name makes New fail with ErrUnknownProfile.
func WithProfile(name string) Option { return func(o *options) { o.profile = name } }

// WithProfileParam fills the {key} placeholder of the profile's URLs
// (Okta's domain, Smaregi's contract_id); a parameter the profile does not
// take makes New fail.
func WithProfileParam(key, value string) Option {
	return func(o *options) {
		if o.profileParams == nil {
			o.profileParams = map[string]string{}
		}
		o.profileParams[key] = value
	}
}

// applyProfile returns cfg completed by the profile of o, the profile
// (generic without WithProfile), and the default lifetime of cfg's access
// tokens (the stored providers keep o's). cfg itself is not changed.
func applyProfile(cfg *oauth2.Config, o *options) (_ *oauth2.Config, _ profiles.Profile, lifetime time.Duration, _ error) {
	p, err := profiles.Get(o.profile)
	if err != nil {
		return nil, profiles.Profile{}, 0, fmt.Errorf("tokenguard: WithProfile: %w", err)
	}
	r, err := p.Resolve(o.profileParams)
	if err != nil {
		return nil, p, 0, fmt.Errorf("tokenguard: WithProfile(%q): %w", p.Name, err)
	}
	if cfg == nil {
		return nil, p, 0, nil
	}
	out := *cfg
	if out.Endpoint.TokenURL == "" {
		if miss := p.Missing(p.TokenURL, o.profileParams); len(miss) > 0 {
			return nil, p, 0, fmt.Errorf("tokenguard: WithProfile(%q) needs WithProfileParam for %s: %w",
				p.Name, strings.Join(miss, ", "), domain.ErrInvalidProvider)
		}
		out.Endpoint.TokenURL = r.TokenURL
		// The auth style comes with the endpoint: a token URL given by the
		// caller keeps the caller's style (auto cannot be told from unset).
		if out.Endpoint.AuthStyle == oauth2.AuthStyleAutoDetect {
			out.Endpoint.AuthStyle = authStyleOf(p.AuthStyle)
		}
	}
	if out.Endpoint.AuthURL == "" {
		out.Endpoint.AuthURL = r.AuthURL
	}
	if o.revocationURL == "" {
		o.revocationURL = r.RevocationURL
	}
	lifetime = o.defaultLifetime
	if lifetime == 0 && p.AccessLifetime.Known {
		lifetime = p.AccessLifetime.D
	}
	return &out, p, lifetime, nil
}

// authStyleOf is the x/oauth2 form of a client authentication style.
func authStyleOf(s domain.AuthStyle) oauth2.AuthStyle {
	switch s {
	case domain.AuthStyleHeader:
		return oauth2.AuthStyleInHeader
	case domain.AuthStyleParams:
		return oauth2.AuthStyleInParams
	}
	return oauth2.AuthStyleAutoDetect
}
