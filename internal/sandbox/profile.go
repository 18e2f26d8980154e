package sandbox

import (
	"regexp"

	"github.com/tokenguard/tokenguard/infra/provider/profiles"
)

// pathParam finds a placeholder in the path of a profile's token URL (a
// per-tenant URL such as Smaregi's /app/{contract_id}/token).
var pathParam = regexp.MustCompile(`https://[^/]+/.*\{`)

// Like sets the switches that make the sandbox behave as the profile
// declares: the dead grant in the provider's words, its reuse grace
// window, the idle and absolute expiry of refresh tokens, a per-tenant
// token URL when the profile's has a placeholder in its path, and its
// extra token fields (with made-up values). What the profile leaves
// unknown stays strict. Rotation stays on whatever the profile says: the
// sandbox always rotates.
func Like(p profiles.Profile, opts Options) Options {
	if len(p.DeadGrants) > 0 {
		d := p.DeadGrants[0]
		opts.DeadGrant = &DeadGrantAnswer{Status: d.Status, Field: d.Field, Code: d.Code, OKFalse: d.OKFalse}
	}
	if p.Grace.Known {
		opts.ReuseGrace = p.Grace.D
	}
	if p.RefreshIdle.Known && p.RefreshIdle.D > 0 {
		opts.RefreshTokenLifespan = p.RefreshIdle.D
	}
	if p.RefreshAbsolute.Known {
		opts.RefreshAbsolute = p.RefreshAbsolute.D
	}
	if pathParam.MatchString(p.TokenURL) {
		opts.Tenant = "tenant-1"
	}
	if len(p.ExtraFields) > 0 {
		opts.ExtraTokenFields = map[string]string{}
		for _, f := range p.ExtraFields {
			opts.ExtraTokenFields[f] = "https://" + f + ".sandbox.example"
		}
	}
	return opts
}
