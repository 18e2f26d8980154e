// Package profiles is the catalog of what real providers' token endpoints do, one
// embedded YAML file per provider under data/. Every claim names its source; what
// the documentation does not give is "unknown" (generic behaviour).
package profiles

import (
	"bytes"
	"cmp"
	"embed"
	"fmt"
	"io/fs"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tokenguard/tokenguard/domain"
)

//go:embed data/*.yaml
var data embed.FS

// Generic is the profile of a spec-compliant provider.
const Generic = "generic"

// Rotation says whether a provider rotates refresh tokens.
type Rotation string

const (
	RotationYes      Rotation = "yes"      // every refresh returns a new refresh token
	RotationNo       Rotation = "no"       // the refresh token stays the same
	RotationOptional Rotation = "optional" // the provider's or the client's setting decides
	RotationUnknown  Rotation = "unknown"
)

// Duration is a lifetime or window a profile knows, or not: "unknown",
// "none" (known zero) or a Go duration, "d" for days allowed ("90d").
type Duration struct {
	D     time.Duration
	Known bool
}

// String is the duration as the files write it.
func (d Duration) String() string {
	switch {
	case !d.Known:
		return "unknown"
	case d.D == 0:
		return "none"
	case d.D%(24*time.Hour) == 0:
		return strconv.FormatInt(int64(d.D/(24*time.Hour)), 10) + "d"
	}
	s := d.D.String() // "30m0s", "8h0m0s"
	if d.D%time.Minute == 0 {
		s = strings.TrimSuffix(s, "0s")
	}
	if d.D%time.Hour == 0 {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// UnmarshalYAML reads "unknown", "none", "90d" or a Go duration.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := parseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*d = v
	return nil
}

func parseDuration(s string) (Duration, error) {
	switch s {
	case "", "unknown":
		return Duration{}, nil
	case "none":
		return Duration{Known: true}, nil
	}
	v, err := time.ParseDuration(s)
	if days, ok := strings.CutSuffix(s, "d"); ok {
		var n int
		n, err = strconv.Atoi(days)
		v = time.Duration(n) * 24 * time.Hour
	}
	if err != nil || v <= 0 {
		return Duration{}, fmt.Errorf("duration %q: want unknown, none, Nd or a Go duration", s)
	}
	return Duration{D: v, Known: true}, nil
}

// DeadGrant is one way a provider says a refresh token is dead: Code in the answer's
// Field ("error" unless said), with HTTP Status (0: any).
type DeadGrant struct {
	Code    string `yaml:"code"`
	Field   string `yaml:"field"`
	Status  int    `yaml:"status"`
	OKFalse bool   `yaml:"ok_false"` // the answer also says "ok": false (Slack); only the sandbox uses it
}

// Profile is one provider's behaviour. URLs may hold {param} placeholders
// (a tenant's subdomain, a contract id, a region), filled by Complete.
type Profile struct {
	Name           string            `yaml:"name"`
	Title          string            `yaml:"title"`
	AuthURL        string            `yaml:"auth_url"`
	TokenURL       string            `yaml:"token_url"`
	RevocationURL  string            `yaml:"revocation_url"`  // RFC 7009; "" when none
	Params         map[string]string `yaml:"params"`          // placeholder defaults; "" = required
	AuthStyle      domain.AuthStyle  `yaml:"auth_style"`      // "auto": both or undocumented
	ScopeSeparator string            `yaml:"scope_separator"` // " " unless said
	AuthParams     map[string]string `yaml:"auth_params"`     // extra authorization request parameters
	Rotation       Rotation          `yaml:"rotation"`
	Grace          Duration          `yaml:"grace"` // a rotated refresh token is still accepted
	AccessLifetime Duration          `yaml:"access_lifetime"`
	// RefreshIdle: unused this long, the refresh token dies; RefreshAbsolute:
	// the grant dies this long after the consent, however often it is used.
	RefreshIdle     Duration    `yaml:"refresh_idle"`
	RefreshAbsolute Duration    `yaml:"refresh_absolute"`
	DeadGrants      []DeadGrant `yaml:"dead_grants"`
	ExtraFields     []string    `yaml:"extra_fields"`    // token answer fields kept as metadata
	CallbackFields  []string    `yaml:"callback_fields"` // callback query fields kept as metadata
	PAR             string      `yaml:"par"`             // "required": only pushed requests (RFC 9126 §5)
	// AssertionAud: token_endpoint (the default) or issuer.
	AssertionAud domain.AssertionAudience `yaml:"assertion_aud"`
	Quirks       string                   `yaml:"quirks"`
	Sources      map[string]string        `yaml:"sources"` // per claim, the page that says it
}

var (
	namePattern  = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,63}$`)
	placeholder  = regexp.MustCompile(`\{([a-z_]+)\}`)
	paramPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
)

// check fills in p's defaults and refuses a profile that is malformed or makes a
// claim without a source.
func (p *Profile) check() error {
	if !namePattern.MatchString(p.Name) {
		return fmt.Errorf("name %q", p.Name)
	}
	p.AuthStyle = cmp.Or(p.AuthStyle, domain.AuthStyleAuto)
	if _, err := domain.ParseAuthStyle(string(p.AuthStyle)); err != nil {
		return err
	}
	p.ScopeSeparator = cmp.Or(p.ScopeSeparator, " ")
	p.Rotation = cmp.Or(p.Rotation, RotationUnknown)
	if !slices.Contains([]Rotation{RotationYes, RotationNo, RotationOptional, RotationUnknown}, p.Rotation) {
		return fmt.Errorf("rotation %q: want yes, no, optional or unknown", p.Rotation)
	}
	if p.PAR != "" && p.PAR != "required" {
		return fmt.Errorf("par %q: want required or nothing", p.PAR)
	}
	p.AssertionAud = cmp.Or(p.AssertionAud, domain.AudienceTokenEndpoint)
	if p.AssertionAud != domain.AudienceTokenEndpoint && p.AssertionAud != domain.AudienceIssuer {
		return fmt.Errorf("assertion_aud %q: want token_endpoint or issuer", p.AssertionAud)
	}
	for i := range p.DeadGrants {
		p.DeadGrants[i].Field = cmp.Or(p.DeadGrants[i].Field, "error")
		if p.DeadGrants[i].Code == "" {
			return fmt.Errorf("dead grant %d has no code", i)
		}
	}
	for _, u := range []string{p.AuthURL, p.TokenURL, p.RevocationURL} {
		for _, m := range placeholder.FindAllStringSubmatch(u, -1) {
			if _, ok := p.Params[m[1]]; !ok {
				return fmt.Errorf("placeholder {%s} has no entry under params", m[1])
			}
		}
	}
	claims := map[string]bool{ // each claim made needs a source
		"urls":             p.TokenURL != "",
		"auth_style":       p.AuthStyle != domain.AuthStyleAuto,
		"auth_params":      len(p.AuthParams) > 0,
		"rotation":         p.Rotation != RotationUnknown,
		"grace":            p.Grace.Known,
		"access_lifetime":  p.AccessLifetime.Known,
		"refresh_idle":     p.RefreshIdle.Known,
		"refresh_absolute": p.RefreshAbsolute.Known,
		"dead_grants":      len(p.DeadGrants) > 0,
		"extra_fields":     len(p.ExtraFields) > 0,
		"callback_fields":  len(p.CallbackFields) > 0,
		"par":              p.PAR != "",
		"assertion_aud":    p.AssertionAud == domain.AudienceIssuer,
	}
	for claim, made := range claims {
		if src := p.Sources[claim]; made && !strings.HasPrefix(src, "https://") {
			return fmt.Errorf("claim %s has no https source", claim)
		}
	}
	return nil
}

var catalog = func() map[string]Profile {
	out := map[string]Profile{}
	files, _ := fs.Glob(data, "data/*.yaml") // fails only on a malformed pattern
	for _, f := range files {
		raw, _ := data.ReadFile(f) // embedded: cannot fail
		var p Profile
		dec := yaml.NewDecoder(bytes.NewReader(raw))
		dec.KnownFields(true)
		err := dec.Decode(&p)
		if err == nil {
			err = p.check()
		}
		if err != nil {
			panic(fmt.Sprintf("profiles: %s: %v", f, err))
		}
		if f != "data/"+p.Name+".yaml" {
			panic(fmt.Sprintf("profiles: %s holds profile %q", f, p.Name))
		}
		out[p.Name] = p
	}
	return out
}()

// Get returns the profile called name ("" is Generic). An unknown name (a newer release's) is
// an error wrapping domain.ErrUnknownProfile, returned with Generic, whose prompt=consent keeps
// a connect link from passing unseen.
func Get(name string) (Profile, error) {
	p, ok := catalog[cmp.Or(name, Generic)]
	if !ok {
		return clone(catalog[Generic]), fmt.Errorf("%w: %q (see tokenctl provider profiles)", domain.ErrUnknownProfile, name)
	}
	return clone(p), nil
}

// All lists the profiles by name.
func All() []Profile {
	out := make([]Profile, 0, len(catalog))
	for _, name := range slices.Sorted(maps.Keys(catalog)) {
		out = append(out, clone(catalog[name]))
	}
	return out
}

func clone(p Profile) Profile {
	p.Params = maps.Clone(p.Params)
	p.AuthParams = maps.Clone(p.AuthParams)
	p.Sources = maps.Clone(p.Sources)
	p.DeadGrants = slices.Clone(p.DeadGrants)
	p.ExtraFields = slices.Clone(p.ExtraFields)
	p.CallbackFields = slices.Clone(p.CallbackFields)
	return p
}

// URLs are a provider's endpoints.
type URLs struct{ Token, Auth, Revocation string }

// MissingParamError is a token URL the profile cannot fill: nobody gave the parameters it needs.
type MissingParamError struct {
	Profile string
	Params  []string
}

func (e *MissingParamError) Error() string {
	return fmt.Sprintf("profile %s needs the parameter %s", e.Profile, strings.Join(e.Params, ", "))
}

func (e *MissingParamError) Unwrap() error { return domain.ErrInvalidProvider }

// Complete fills the URLs given leaves empty with the profile's, placeholders
// filled with params or the defaults. A token URL left empty for want of a
// parameter is a *MissingParamError; another such URL stays empty. An unknown
// parameter or a value that is not a plain label wraps domain.ErrInvalidProvider.
func (p Profile) Complete(given URLs, params map[string]string) (URLs, error) {
	vals := maps.Clone(p.Params)
	for k, v := range params {
		if _, ok := p.Params[k]; !ok {
			return URLs{}, fmt.Errorf("%w: profile %s takes no parameter %q (it takes: %s)", domain.ErrInvalidProvider, p.Name, k, cmp.Or(strings.Join(p.ParamNames(), ", "), "none"))
		}
		if !paramPattern.MatchString(v) {
			return URLs{}, fmt.Errorf("%w: parameter %s must be 1-128 of A-Z a-z 0-9 . _ -", domain.ErrInvalidProvider, k)
		}
		vals[k] = v
	}
	fill := func(given, u string) (filled string, missing []string) {
		if given != "" {
			return given, nil
		}
		filled = placeholder.ReplaceAllStringFunc(u, func(m string) string {
			name := m[1 : len(m)-1]
			if vals[name] == "" && !slices.Contains(missing, name) {
				missing = append(missing, name)
			}
			return url.PathEscape(vals[name])
		})
		if missing != nil {
			return "", missing
		}
		return filled, nil
	}
	token, missing := fill(given.Token, p.TokenURL)
	if missing != nil {
		return URLs{}, &MissingParamError{Profile: p.Name, Params: missing}
	}
	auth, _ := fill(given.Auth, p.AuthURL)
	revocation, _ := fill(given.Revocation, p.RevocationURL)
	return URLs{Token: token, Auth: auth, Revocation: revocation}, nil
}

// ParamNames lists the parameters the profile's URLs take.
func (p Profile) ParamNames() []string { return slices.Sorted(maps.Keys(p.Params)) }

// ParseParams reads "k=v" pairs (--param flags, OAUTH_PROFILE_PARAMS).
func ParseParams(pairs []string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range pairs {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%w: parameter %q: want KEY=VALUE", domain.ErrInvalidProvider, kv)
		}
		out[k] = v
	}
	return out, nil
}
