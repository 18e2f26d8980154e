// Package clientkey holds a client's private key for private_key_jwt client authentication
// (RFC 7523 §2.2, OpenID Connect Core §9): each token request carries a fresh assertion signed
// with it instead of a client secret.
package clientkey

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// ErrBadKey: not a PEM EC P-256 or RSA (2048 bits or more) private key.
var ErrBadKey = errors.New("clientkey: not a PEM EC P-256 or RSA (>= 2048 bits) private key")

// AssertionType is client_assertion_type's value (RFC 7523 §2.2).
const AssertionType = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"

// Lifetime is an assertion's: short, since each is used once.
const Lifetime = time.Minute

// Key is a client's signing key: ES256 for EC P-256, RS256 for RSA. Its kid is its RFC 7638
// thumbprint. Printing it in any form shows only the kid. Safe for concurrent use.
type Key struct {
	signer crypto.Signer
	alg    jose.SignatureAlgorithm
	kid    string
	jose   jose.Signer
}

// FromSigner wraps an EC P-256 or RSA private key.
func FromSigner(s crypto.Signer) (*Key, error) {
	var alg jose.SignatureAlgorithm
	switch k := s.(type) {
	case *ecdsa.PrivateKey:
		if k.Curve != elliptic.P256() {
			return nil, ErrBadKey
		}
		alg = jose.ES256
	case *rsa.PrivateKey:
		if k.N.BitLen() < 2048 {
			return nil, ErrBadKey
		}
		alg = jose.RS256
	default:
		return nil, ErrBadKey
	}
	tp, err := (&jose.JSONWebKey{Key: s.Public()}).Thumbprint(crypto.SHA256)
	if err != nil {
		return nil, ErrBadKey
	}
	kid := base64.RawURLEncoding.EncodeToString(tp)
	js, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: jose.JSONWebKey{Key: s, KeyID: kid, Algorithm: string(alg)}},
		(&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		return nil, fmt.Errorf("clientkey: signer: %w", err)
	}
	return &Key{signer: s, alg: alg, kid: kid, jose: js}, nil
}

// ParsePEM reads a PEM private key: PKCS #8, SEC 1 (EC) or PKCS #1 (RSA). Errors never quote the input.
func ParsePEM(data []byte) (*Key, error) {
	s, err := ParseSigner(data)
	if err != nil {
		return nil, err
	}
	return FromSigner(s)
}

// ParseSigner decodes a PEM private key of any algorithm (dpop shares it). Errors never quote the input.
func ParseSigner(data []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(data)
	var k any
	err := ErrBadKey // no PEM block, or not a private key's
	switch {
	case block == nil:
	case block.Type == "PRIVATE KEY":
		k, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case block.Type == "EC PRIVATE KEY":
		k, err = x509.ParseECPrivateKey(block.Bytes)
	case block.Type == "RSA PRIVATE KEY":
		k, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	}
	s, ok := k.(crypto.Signer)
	if err != nil || !ok {
		return nil, ErrBadKey
	}
	return s, nil
}

// Signer is the private key, for WithClientKey.
func (k *Key) Signer() crypto.Signer { return k.signer }

// KID is the key's RFC 7638 thumbprint.
func (k *Key) KID() string { return k.kid }

// PublicJWK is the public half, as a JWKS serves it.
func (k *Key) PublicJWK() jose.JSONWebKey {
	return jose.JSONWebKey{Key: k.signer.Public(), KeyID: k.kid, Algorithm: string(k.alg), Use: "sig"}
}

// Assertion is a client assertion for one token request: iss = sub = clientID, aud audience (the
// token endpoint, or the issuer), a short exp and a unique jti.
func (k *Key) Assertion(clientID, audience string, now time.Time) (string, error) {
	claims := map[string]any{"iss": clientID, "sub": clientID, "aud": audience, "iat": now.Unix(),
		"exp": now.Add(Lifetime).Unix(), "jti": rand.Text()}
	jws, err := jwt.Signed(k.jose).Claims(claims).Serialize()
	if err != nil {
		return "", fmt.Errorf("clientkey: sign: %w", err)
	}
	return jws, nil
}

func (k *Key) String() string               { return "client-key(" + k.kid + ")" }
func (k *Key) Format(f fmt.State, _ rune)   { _, _ = f.Write([]byte(k.String())) }
func (k *Key) LogValue() slog.Value         { return slog.StringValue(k.String()) }
func (k *Key) MarshalText() ([]byte, error) { return []byte(k.String()), nil }
