package domain

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"log/slog"
	"strings"
)

// Secret holds a credential: a struct, so that no conversion or format verb can leak it.
// The value sits behind a pointer because fmt prints a Secret in an unexported field raw,
// and then shows an address, not the credential.
type Secret struct{ v *string }

// NewSecret wraps a credential.
func NewSecret(s string) Secret {
	if s == "" {
		return Secret{}
	}
	return Secret{v: &s}
}

// Prefixes make tokenguard's credentials recognisable and tell them apart.
const (
	APIKeyPrefix  = "tgk_"
	SessionPrefix = "tgs_" // a connect session
	FlowPrefix    = "tgf_" // a browser's connect flow
	ResultPrefix  = "tgr_" // a connect result code
	ConsolePrefix = "tgc_" // a console session
)

// NewCredential returns prefix followed by 256 random bits in base64url.
func NewCredential(prefix string) Secret {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return NewSecret(prefix + base64.RawURLEncoding.EncodeToString(b))
}

// WellFormed reports whether s can be a credential NewCredential(prefix) made: checked before
// any lookup, so that a stranger's input never reaches the store.
func WellFormed(s, prefix string) bool {
	return strings.HasPrefix(s, prefix) && len(s) <= 128
}

// Reveal returns the credential, only where it leaves for the provider, the protected API or the database.
func (s Secret) Reveal() string {
	if s.v == nil {
		return ""
	}
	return *s.v
}

// IsZero reports whether the secret is empty.
func (s Secret) IsZero() bool { return s.v == nil }

// Equal reports whether two secrets hold the same value.
func (s Secret) Equal(o Secret) bool { return s.Reveal() == o.Reveal() }

// Format covers every verb, %#v, %x and %q included, which would otherwise bypass String.
func (s Secret) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(s.String())) }

// LogValue keeps slog from ever seeing the value.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalText keeps encoders (JSON, YAML, text logs) from seeing the value.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// String masks the value: "[REDACTED]", or "" for the zero Secret.
func (s Secret) String() string {
	if s.v == nil {
		return ""
	}
	return "[REDACTED]"
}
