// Package tokencrypt seals token values for storage with AES-256-GCM.
//
// Keys come from TOKEN_ENCRYPTION_KEYS, comma-separated id=key entries:
//
//	TOKEN_ENCRYPTION_KEYS="k2=<base64 of 32 random bytes>*,k1=<base64 of 32 random bytes>"
//
// An id is 1 to 32 of a-z 0-9 _ -, unique; a key is 32 bytes in standard
// base64. The key marked '*' (optional for one key) seals; every key opens.
//
// A sealed value fits the existing text columns:
//
//	tg1:<key id>:b:<base64url, unpadded, of nonce (12 bytes) | ciphertext | tag (16 bytes)>
//
// The GCM additional data is "tg1:<key id>:b:" plus the caller's aad (row id, version sealed at,
// column), so a ciphertext moved to another row, column or key id, or back after a rewrite, fails
// to open. The previous form "tg1:<key id>:<body>" (aad naming the row only) still opens, is never
// written, and is resealed by tokenctl rotate-key.
//
// A value without "tg1:" is plaintext from before encryption: Open returns it until rotate-key
// seals it. "" is never sealed. Errors never contain a plaintext, a ciphertext or a key.
package tokencrypt

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"

	"github.com/tokenguard/tokenguard/domain"
)

const (
	// EnvKeys is the variable the key list is read from; errors name it.
	EnvKeys = "TOKEN_ENCRYPTION_KEYS"
	// EnvRequired names the setting that refuses plaintext rows.
	EnvRequired = "TOKEN_ENCRYPTION_REQUIRED"

	prefix    = "tg1:"
	keySize   = 32 // AES-256
	nonceSize = 12 // GCM standard nonce
	tagSize   = 16
)

var (
	keyIDPattern = regexp.MustCompile(`^[a-z0-9_-]{1,32}$`)
	// envelope bodies are strict: a changed character can never decode to
	// the same bytes through non-canonical trailing bits.
	bodyEncoding = base64.RawURLEncoding.Strict()
)

// Keyring holds the configured keys; safe for concurrent use. Printed in any way, it shows key ids only.
type Keyring struct {
	current  string
	ids      []string // sorted
	aeads    map[string]cipher.AEAD
	required bool // legacy plaintext is refused (RequireSealed)
}

// RequireSealed makes Open refuse legacy plaintext (once every row is sealed, one was written around tokenguard).
func (k *Keyring) RequireSealed() *Keyring {
	k.required = true
	return k
}

// ParseKeyring reads a TOKEN_ENCRYPTION_KEYS value. Errors name the variable and entry, never a key.
func ParseKeyring(spec string) (*Keyring, error) {
	if strings.TrimSpace(spec) == "" {
		return nil, fmt.Errorf("%s is empty", EnvKeys)
	}
	entries := strings.Split(spec, ",")
	k := &Keyring{aeads: make(map[string]cipher.AEAD, len(entries))}
	for i, entry := range entries {
		where := fmt.Sprintf("%s entry %d", EnvKeys, i+1)
		id, key, ok := strings.Cut(strings.TrimSpace(entry), "=")
		if !ok {
			return nil, fmt.Errorf("%s: want id=base64key, with '*' after the current key", where)
		}
		id = strings.TrimSpace(id)
		if !keyIDPattern.MatchString(id) {
			return nil, fmt.Errorf("%s: key id must be 1-32 of a-z 0-9 _ -", where)
		}
		where = fmt.Sprintf("%s (key id %q)", where, id)
		if _, dup := k.aeads[id]; dup {
			return nil, fmt.Errorf("%s: key id listed twice", where)
		}
		key, current := strings.CutSuffix(strings.TrimSpace(key), "*")
		if current {
			if k.current != "" {
				return nil, fmt.Errorf("%s: more than one key is marked current with '*'", where)
			}
			k.current = id
		}
		raw, err := base64.StdEncoding.Strict().DecodeString(strings.TrimSpace(key))
		if err != nil || len(raw) != keySize {
			return nil, fmt.Errorf("%s: key must be %d random bytes in standard base64 (openssl rand -base64 32)", where, keySize)
		}
		block, _ := aes.NewCipher(raw)        // fails only for a key of the wrong size
		k.aeads[id], _ = cipher.NewGCM(block) // fails only for a block size other than AES's
		k.ids = append(k.ids, id)
	}
	if k.current == "" {
		if len(k.ids) != 1 {
			return nil, fmt.Errorf("%s: mark the current key with '*' after it (id=base64key*)", EnvKeys)
		}
		k.current = k.ids[0]
	}
	slices.Sort(k.ids)
	return k, nil
}

// Current is the id of the key Seal uses.
func (k *Keyring) Current() string { return k.current }

// Seal encrypts plaintext under the current key and a fresh random nonce, bound to aad; "" stays "".
func (k *Keyring) Seal(plaintext, aad string) (string, error) {
	if plaintext == "" {
		return "", nil
	}
	head := header(k.current)
	buf := make([]byte, nonceSize, nonceSize+len(plaintext)+tagSize)
	_, _ = rand.Read(buf) // never fails (it crashes the program instead)
	buf = k.aeads[k.current].Seal(buf, buf[:nonceSize], []byte(plaintext), []byte(head+aad))
	return head + bodyEncoding.EncodeToString(buf), nil
}

// boundMark after the key id marks the current form of envelope.
const boundMark = "b"

// header starts an envelope of the current form sealed with key id.
func header(id string) string { return prefix + id + ":" + boundMark + ":" }

// Bound reports whether stored is an envelope of the current form (aad as Seal's caller gives it now).
func (k *Keyring) Bound(stored string) bool {
	rest, sealed := strings.CutPrefix(stored, prefix)
	_, rest, _ = strings.Cut(rest, ":")
	return sealed && strings.HasPrefix(rest, boundMark+":")
}

// Open decrypts a value Seal produced with the same aad under any key in the ring; legacy plaintext
// is returned as it is, unless RequireSealed. Failures are *OpenError.
func (k *Keyring) Open(stored, aad string) (string, error) {
	if !IsSealed(stored) {
		if k.required && stored != "" {
			return "", &OpenError{Reason: "it is plaintext, and " + EnvRequired + " is set (run tokenctl rotate-key)"}
		}
		return stored, nil
	}
	id, ok := KeyID(stored)
	if !ok {
		return "", &OpenError{Reason: "malformed envelope"}
	}
	body := strings.TrimPrefix(stored[len(prefix)+len(id)+1:], boundMark+":")
	raw, err := bodyEncoding.DecodeString(body)
	if err != nil || len(raw) < nonceSize+tagSize {
		return "", &OpenError{KeyID: id, Reason: "malformed envelope"}
	}
	aead, ok := k.aeads[id]
	if !ok {
		return "", &OpenError{KeyID: id, Reason: "its key id is not in " + EnvKeys}
	}
	// Everything before the body, in either form, is with the caller's aad the GCM additional data.
	head := stored[:len(stored)-len(body)]
	pt, err := aead.Open(nil, raw[:nonceSize], raw[nonceSize:], []byte(head+aad))
	if err != nil {
		return "", &OpenError{KeyID: id, Reason: "authentication failed (altered, rolled back to an older value, or moved from another row or column)"}
	}
	return string(pt), nil
}

// IsCurrent reports whether stored needs no resealing: empty, or sealed with the current key and form.
func (k *Keyring) IsCurrent(stored string) bool {
	return stored == "" || strings.HasPrefix(stored, header(k.current))
}

// IsSealed reports whether stored is an envelope (well formed or not) rather than legacy plaintext.
func IsSealed(stored string) bool { return strings.HasPrefix(stored, prefix) }

// KeyID returns the key id an envelope names, if it is well formed enough to name one.
func KeyID(stored string) (string, bool) {
	if !IsSealed(stored) {
		return "", false
	}
	id, _, ok := strings.Cut(stored[len(prefix):], ":")
	return id, ok && keyIDPattern.MatchString(id)
}

// String shows the key ids and which one is current, never key bytes. Format (every verb: %#v
// would print the expanded keys) and LogValue are String.
func (k *Keyring) String() string {
	if k == nil {
		return "Keyring(none)"
	}
	return fmt.Sprintf("Keyring(current=%s keys=%s)", k.current, strings.Join(k.ids, ","))
}

func (k *Keyring) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(k.String())) }
func (k *Keyring) LogValue() slog.Value       { return slog.StringValue(k.String()) }

// OpenError says why a stored value could not be decrypted, never carrying it; wraps domain.ErrUndecryptable.
type OpenError struct {
	KeyID  string // the envelope's key id; empty when it names none
	Reason string
}

func (e *OpenError) Error() string {
	if e.KeyID == "" {
		return fmt.Sprintf("%v: %s", domain.ErrUndecryptable, e.Reason)
	}
	return fmt.Sprintf("%v: sealed with key id %q: %s", domain.ErrUndecryptable, e.KeyID, e.Reason)
}

func (e *OpenError) Unwrap() error { return domain.ErrUndecryptable }

// KeySpec is a TOKEN_ENCRYPTION_KEYS value; it prints as [REDACTED] under every verb and encoder.
type KeySpec string

// Keyring parses the spec; see ParseKeyring.
func (s KeySpec) Keyring() (*Keyring, error) { return ParseKeyring(string(s)) }

func (s KeySpec) String() string {
	if s == "" {
		return ""
	}
	return "[REDACTED]"
}

func (s KeySpec) Format(f fmt.State, _ rune)   { _, _ = f.Write([]byte(s.String())) }
func (s KeySpec) LogValue() slog.Value         { return slog.StringValue(s.String()) }
func (s KeySpec) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Plaintext is the Sealer of a store without keys. It refuses envelopes
// rather than hand one to the provider as a token.
type Plaintext struct{}

// Seal returns p unchanged.
func (Plaintext) Seal(p, _ string) (string, error) { return p, nil }

// Open returns a plaintext value, and refuses an envelope.
func (Plaintext) Open(stored, _ string) (string, error) {
	if IsSealed(stored) {
		id, _ := KeyID(stored)
		return "", fmt.Errorf("%w: sealed with key id %q, but no %s are configured", domain.ErrUndecryptable, id, EnvKeys)
	}
	return stored, nil
}

// IsCurrent reports whether stored is plaintext.
func (Plaintext) IsCurrent(stored string) bool { return !IsSealed(stored) }

// Bound is false: a store without keys seals nothing.
func (Plaintext) Bound(string) bool { return false }
