package domain

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"
)

// Provider is a stored OAuth2 client registration, so that a deployment may serve several; printing it shows no secret.
type Provider struct {
	Name          string
	TokenURL      string
	AuthURL       string
	RevocationURL string // RFC 7009; "" when the provider has none
	APIBaseURL    string // where the bundled apps send the connection's API calls; "" = API_BASE_URL
	ClientID      string
	ClientSecret  Secret
	AuthStyle     AuthStyle
	Scopes        []string
	// Skew, DefaultLifetime and KeepAlive: zero takes the process's setting.
	Skew            time.Duration
	DefaultLifetime time.Duration
	KeepAlive       time.Duration
	Profile         string // the provider profile it was added with; "" is the generic one
	Version         int64  // bumped by every update
	CreatedAt       time.Time
	UpdatedAt       time.Time
	DPoP            bool      // requires DPoP-bound grants (RFC 9449), each with a key of its own
	Resource        string    // RFC 8707 resource indicator of every request; "" none
	PAR             PARMode   // when the connect flow pushes its request (RFC 9126); "" is auto
	ClientKey       Secret    // PEM private key of private_key_jwt; sealed at rest like ClientSecret
	TokenRate       TokenRate // the token-request budget of the whole deployment; zero: none
}

// AuthStyle is how the client authenticates at the token endpoint.
type AuthStyle string

const (
	// AuthStyleAuto: HTTP Basic first, the form body only after the provider refused it.
	AuthStyleAuto          AuthStyle = "auto"
	AuthStyleHeader        AuthStyle = "header"          // HTTP Basic (client_secret_basic)
	AuthStyleParams        AuthStyle = "params"          // form body (client_secret_post)
	AuthStylePrivateKeyJWT AuthStyle = "private_key_jwt" // an assertion signed with ClientKey (RFC 7523 §2.2), no secret
)

// ParseAuthStyle reads "auto" (or ""), "header", "params" or "private_key_jwt".
func ParseAuthStyle(s string) (AuthStyle, error) {
	return parseChoice(s, "auth style must be auto, header, params or private_key_jwt",
		AuthStyleAuto, AuthStyleHeader, AuthStyleParams, AuthStylePrivateKeyJWT)
}

// parseChoice reads s as one of choices, "" as the first; errors wrap ErrInvalidProvider.
func parseChoice[T ~string](s, want string, choices ...T) (T, error) {
	if c := cmp.Or(T(s), choices[0]); slices.Contains(choices, c) {
		return c, nil
	}
	return "", fmt.Errorf("%w: %s, got %q", ErrInvalidProvider, want, s)
}

// ReservedProviderName is what metrics call the OAUTH_* provider; no stored provider may take it.
const ReservedProviderName = "default"

// Errors of stored providers.
var (
	// ErrUnknownProvider: a connection or an import names no registered provider; no grant is touched.
	ErrUnknownProvider = errors.New("unknown provider (see tokenctl provider list)")
	ErrProviderExists  = errors.New("a provider with that name exists")
	ErrProviderInUse   = errors.New("provider still used by connections")
	// ErrInvalidProvider: a provider's settings are malformed.
	ErrInvalidProvider = errors.New("invalid provider")
	ErrUnknownProfile  = errors.New("unknown provider profile")
	// ErrNoAPIBaseURL: the connection's stored provider has no API base URL; its token never goes to API_BASE_URL.
	ErrNoAPIBaseURL = errors.New("the connection's provider has no API base URL (tokenctl provider update --api-base-url)")
	// ErrNoRevocationEndpoint: a revocation was asked of a provider without one. Nothing was changed.
	ErrNoRevocationEndpoint = errors.New("the provider has no revocation endpoint configured")
)

// Validate checks what can be checked without asking the provider; errors never show the secret.
func (p Provider) Validate() error {
	if err := ValidateName(p.Name); err != nil {
		return fmt.Errorf("%w: name: %w", ErrInvalidProvider, err)
	}
	if p.Name == ReservedProviderName {
		return fmt.Errorf("%w: the name %q stands for the OAUTH_* provider in metrics and logs", ErrInvalidProvider, p.Name)
	}
	if p.ClientID == "" {
		return fmt.Errorf("%w: client id is empty", ErrInvalidProvider)
	}
	for _, f := range append(p.urls(), urlField{"resource", p.Resource}) {
		if (f.v != "" || f.name == "token URL") && CheckURL(f.v, true) != nil {
			return fmt.Errorf("%w: %s must be an http(s) URL, got %q", ErrInvalidProvider, f.name, f.v)
		}
	}
	if _, err := ParseAuthStyle(string(p.AuthStyle)); err != nil {
		return err
	}
	if (p.AuthStyle == AuthStylePrivateKeyJWT) != !p.ClientKey.IsZero() {
		return fmt.Errorf("%w: auth style private_key_jwt and a client key go together (--auth-style private_key_jwt --client-key-file PATH)", ErrInvalidProvider)
	}
	if _, err := ParsePARMode(string(p.PAR)); err != nil {
		return err
	}
	if p.Skew < 0 || p.DefaultLifetime < 0 || p.KeepAlive < 0 {
		return fmt.Errorf("%w: skew, default lifetime and keep-alive must not be negative", ErrInvalidProvider)
	}
	if err := p.TokenRate.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidProvider, err)
	}
	return nil
}

// LogValue shows what operators need and never the secret.
func (p Provider) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("provider", p.Name),
		slog.String("token_url", p.TokenURL),
		slog.String("client_id", p.ClientID),
		slog.Int64("version", p.Version),
	)
}
