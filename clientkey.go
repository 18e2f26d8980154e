package tokenguard

import (
	"crypto"
	"encoding/json"

	jose "github.com/go-jose/go-jose/v4"
)

// WithClientKey authenticates the client of New's oauth2.Config with
// private_key_jwt (RFC 7523 §2.2) instead of its client secret: every
// token request (code exchange, refresh) carries a fresh assertion signed
// with signer (EC P-256: ES256; RSA of 2048 bits or more: RS256), iss and
// sub the client id, aud the token endpoint, a one-minute exp and a unique
// jti. Its kid is its RFC 7638 thumbprint; ClientJWKS serves its public
// half for providers that fetch the client's keys.
func WithClientKey(signer crypto.Signer) Option { return func(o *options) { o.clientKey = signer } }

// ClientJWKS is the JSON Web Key Set of the public halves of the client
// keys in use ({"keys":[]} when none), as GET /.well-known/jwks.json
// serves it.
func (t *Tokens) ClientJWKS() []byte {
	set := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{}}
	if t.clientKey != nil {
		set.Keys = append(set.Keys, t.clientKey.PublicJWK())
	}
	b, _ := json.Marshal(set)
	return b
}

// WithResource names the resource server the access tokens of New's
// oauth2.Config's provider are for (RFC 8707): sent on the authorization
// request of the connect flow and on every token request (code exchange,
// refresh).
func WithResource(url string) Option { return func(o *options) { o.resource = url } }
