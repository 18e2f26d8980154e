// Package dpop holds a connection's DPoP key (RFC 9449) and signs its proofs. With DPoP a refresh
// token is worthless without the private key it is bound to, so the key is part of the grant:
// stored sealed with it, shared by every process, lost with it.
package dpop

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/tokenguard/tokenguard/infra/clientkey"
)

// ErrBadKey: a DPoP key that is not a PEM EC P-256 private key.
var ErrBadKey = errors.New("dpop: not a PEM EC P-256 private key")

// Key is a connection's DPoP key pair (ES256). Printing it in any form shows only its thumbprint;
// MarshalPEM is the one way out for the private half (to be sealed). Safe for concurrent use.
type Key struct {
	priv   *ecdsa.PrivateKey
	jkt    string
	signer jose.Signer
}

// Generate makes a new ES256 key.
func Generate() (*Key, error) {
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("dpop: generate key: %w", err)
	}
	return FromSigner(priv)
}

// Derive makes the ES256 key that seed (256 bits or more) stands for. The connect flow derives the
// key (dpop_jkt) and the PKCE verifier from one seed, so nothing else is kept between the two
// requests and the verifier reveals nothing of the key.
func Derive(seed []byte) (*Key, error) {
	for i := range 8 { // a draw outside the curve's order is rare (< 2^-32)
		d, err := derive(seed, "tokenguard connect-flow DPoP key "+strconv.Itoa(i))
		if err != nil {
			return nil, err
		}
		if priv, err := ecdsa.ParseRawPrivateKey(elliptic.P256(), d); err == nil {
			return FromSigner(priv)
		}
	}
	return nil, errors.New("dpop: derive: no key from this seed")
}

// DeriveVerifier is the PKCE verifier (RFC 7636: 43 base64url characters) that seed stands for,
// independent of Derive's key.
func DeriveVerifier(seed []byte) (string, error) {
	v, err := derive(seed, "tokenguard connect-flow PKCE verifier")
	return base64.RawURLEncoding.EncodeToString(v), err
}

// derive is the 32 bytes HKDF-SHA256 draws from seed for info.
func derive(seed []byte, info string) ([]byte, error) {
	if len(seed) < 32 {
		return nil, errors.New("dpop: derive: the seed is shorter than 256 bits")
	}
	d, err := hkdf.Key(sha256.New, seed, nil, info, 32)
	if err != nil {
		return nil, fmt.Errorf("dpop: derive: %w", err)
	}
	return d, nil
}

// FromSigner wraps an EC P-256 private key.
func FromSigner(s crypto.Signer) (*Key, error) {
	priv, ok := s.(*ecdsa.PrivateKey)
	if !ok || priv.Curve != elliptic.P256() {
		return nil, ErrBadKey
	}
	tp, err := (&jose.JSONWebKey{Key: priv.Public()}).Thumbprint(crypto.SHA256) // RFC 7638: crv, kty, x, y only
	if err != nil {
		return nil, fmt.Errorf("dpop: thumbprint: %w", err)
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: priv},
		(&jose.SignerOptions{EmbedJWK: true}).WithType("dpop+jwt"))
	if err != nil {
		return nil, fmt.Errorf("dpop: signer: %w", err)
	}
	return &Key{priv: priv, jkt: base64.RawURLEncoding.EncodeToString(tp), signer: signer}, nil
}

// ParsePEM reads a PEM private key (PKCS #8 or SEC 1) on P-256. Errors never quote the input.
func ParsePEM(data []byte) (*Key, error) {
	s, err := clientkey.ParseSigner(data)
	if err != nil {
		return nil, ErrBadKey
	}
	return FromSigner(s)
}

// MarshalPEM is the private key in PKCS #8 PEM: for sealing, never for printing.
func (k *Key) MarshalPEM() []byte {
	der, err := x509.MarshalPKCS8PrivateKey(k.priv)
	if err != nil {
		panic("dpop: marshal a P-256 key: " + err.Error()) // cannot happen for a P-256 key
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// Thumbprint is the public key's RFC 7638 SHA-256 thumbprint, base64url: the jkt tokens bind to.
func (k *Key) Thumbprint() string { return k.jkt }

func (k *Key) String() string               { return "dpop-key(" + k.jkt + ")" }
func (k *Key) Format(f fmt.State, _ rune)   { _, _ = f.Write([]byte(k.String())) }
func (k *Key) LogValue() slog.Value         { return slog.StringValue(k.String()) }
func (k *Key) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// claims are a proof's claims (RFC 9449 §4.2).
type claims struct {
	JTI   string `json:"jti"`
	HTM   string `json:"htm"`
	HTU   string `json:"htu"`
	IAT   int64  `json:"iat"`
	ATH   string `json:"ath,omitempty"`
	Nonce string `json:"nonce,omitempty"`
}

// Proof signs a proof for one request: method, target (as htu: without query and fragment), the
// access token's hash if any (resource calls), the server's nonce if any.
func (k *Key) Proof(method, target, accessToken, nonce string, now time.Time) (string, error) {
	u, err := url.Parse(target)
	if err != nil || u.Scheme == "" || u.Host == "" {
		shown := target[:strings.IndexAny(target+"?", "?#")] // without query or fragment
		return "", fmt.Errorf("dpop: %q is not an absolute URL", shown)
	}
	u.RawQuery, u.Fragment, u.RawFragment, u.User = "", "", "", nil
	c := claims{JTI: rand.Text(), HTM: strings.ToUpper(method), HTU: u.String(), IAT: now.Unix(), Nonce: nonce}
	if accessToken != "" {
		ath := sha256.Sum256([]byte(accessToken))
		c.ATH = base64.RawURLEncoding.EncodeToString(ath[:])
	}
	jws, err := jwt.Signed(k.signer).Claims(c).Serialize()
	if err != nil {
		return "", fmt.Errorf("dpop: sign proof: %w", err)
	}
	return jws, nil
}
