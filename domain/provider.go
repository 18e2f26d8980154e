package domain

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"time"
)

// Provider is an OAuth2 client registration at a provider, stored so that
// one deployment serves connections granted by several providers. A
// connection names its provider (Token.Provider); one that names none uses
// the provider of the process's configuration (the OAUTH_* environment).
//
// ClientSecret is a Secret: printing a Provider never shows it.
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
	// Zero takes the process's global setting.
	Skew            time.Duration
	DefaultLifetime time.Duration
	KeepAlive       time.Duration
	// Profile names the provider profile it was added with ("" is the
	// generic one): its dead-grant codes and extra answer fields apply.
	Profile   string
	Version   int64 // bumped by every update
	CreatedAt time.Time
	UpdatedAt time.Time
	// DPoP: the provider requires DPoP-bound grants (RFC 9449); each
	// connection gets a key of its own at connect time.
	DPoP bool
	// Resource is the RFC 8707 resource indicator of every authorization
	// and token request; "" none.
	Resource string
	// PAR says when the connect flow pushes its authorization request
	// (RFC 9126); "" is auto.
	PAR PARMode
	// ClientKey is the PEM private key (EC P-256 or RSA) of
	// AuthStyle private_key_jwt; sealed at rest like ClientSecret.
	ClientKey Secret
	// TokenRate is the token-request budget every process of the
	// deployment respects together (zero: none).
	TokenRate TokenRate
}

// AuthStyle is how the client authenticates at the token endpoint.
type AuthStyle string

const (
	// AuthStyleAuto: HTTP Basic first, the form body only after the
	// provider said the client's authentication failed; the winner is
	// remembered per token URL and client id.
	AuthStyleAuto   AuthStyle = "auto"
	AuthStyleHeader AuthStyle = "header" // HTTP Basic (client_secret_basic)
	AuthStyleParams AuthStyle = "params" // form body (client_secret_post)
	// AuthStylePrivateKeyJWT: a client assertion signed with the
	// provider's ClientKey (RFC 7523 §2.2) instead of a secret.
	AuthStylePrivateKeyJWT AuthStyle = "private_key_jwt"
)

// ParseAuthStyle reads "auto", "header", "params" or "private_key_jwt"
// ("" is auto).
func ParseAuthStyle(s string) (AuthStyle, error) {
	switch AuthStyle(s) {
	case "", AuthStyleAuto:
		return AuthStyleAuto, nil
	case AuthStyleHeader, AuthStyleParams, AuthStylePrivateKeyJWT:
		return AuthStyle(s), nil
	}
	return "", fmt.Errorf("%w: auth style must be auto, header, params or private_key_jwt, got %q", ErrInvalidProvider, s)
}

// ReservedProviderName is what metrics call the provider of the process's
// configuration; no stored provider may take it.
const ReservedProviderName = "default"

// Provider errors.
var (
	// ErrUnknownProvider: a connection (or an import) names a provider
	// that is not registered. No grant is touched: like a rejected client,
	// it is a configuration error, never a reason to mark a connection
	// needs_reauth.
	ErrUnknownProvider = errors.New("unknown provider (see tokenctl provider list)")
	// ErrProviderExists: a provider by that name is registered already.
	ErrProviderExists = errors.New("a provider with that name exists")
	// ErrProviderInUse: connections still name the provider.
	ErrProviderInUse = errors.New("provider still used by connections")
	// ErrInvalidProvider: a provider's settings are malformed.
	ErrInvalidProvider = errors.New("invalid provider")
	// ErrUnknownProfile: no provider profile has that name.
	ErrUnknownProfile = errors.New("unknown provider profile")
	// ErrNoAPIBaseURL: a connection's stored provider has no API base URL.
	// Its token is never sent to another provider's API (API_BASE_URL).
	ErrNoAPIBaseURL = errors.New("the connection's provider has no API base URL (tokenctl provider update --api-base-url)")
)

// Validate checks what can be checked without asking the provider. Errors
// wrap ErrInvalidProvider (or ErrInvalidConnection for the name) and never
// show the client secret.
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
	for field, v := range map[string]string{"token URL": p.TokenURL, "auth URL": p.AuthURL,
		"revocation URL": p.RevocationURL, "API base URL": p.APIBaseURL, "resource": p.Resource} {
		if v == "" && field != "token URL" {
			continue
		}
		if u, err := url.Parse(v); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("%w: %s must be an http(s) URL, got %q", ErrInvalidProvider, field, v)
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
