package tokenguard

import (
	"crypto"
	"encoding/json"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/clientkey"
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
	seen := map[string]bool{}
	for _, k := range append([]*clientkey.Key{t.clientKey}, t.providers.ClientKeys()...) {
		if k != nil && !seen[k.KID()] {
			seen[k.KID()] = true
			set.Keys = append(set.Keys, k.PublicJWK())
		}
	}
	b, _ := json.Marshal(set)
	return b
}

// WithResource names the resource server the access tokens of New's
// oauth2.Config's provider are for (RFC 8707): sent on the authorization
// request of the connect flow and on every token request (code exchange,
// refresh).
func WithResource(url string) Option { return func(o *options) { o.resource = url } }

// PARMode says when the connect flow pushes its authorization request
// (RFC 9126): PARAuto (the default) when the provider's metadata or
// profile says it requires it, PARAlways, or PARNever.
type PARMode = domain.PARMode

// The PAR modes (OAUTH_PAR, tokenctl provider add --par).
const (
	PARAuto   = domain.PARAuto
	PARAlways = domain.PARAlways
	PARNever  = domain.PARNever
)

// ParsePARMode reads "auto", "always" or "never"; other values are an
// error wrapping ErrInvalidProvider.
func ParsePARMode(s string) (PARMode, error) { return domain.ParsePARMode(s) }

// WithPAR says when the connect flow of New's oauth2.Config's provider
// pushes its authorization request to the provider (RFC 9126): the
// request (PKCE S256, the profile's parameters, the resource indicator
// and, with DPoP, dpop_jkt) is posted with the client's authentication,
// as a token request, and the browser goes to the authorization endpoint
// with only client_id and request_uri. The provider's metadata is found
// from its token endpoint. A mode ParsePARMode refuses makes New fail.
func WithPAR(mode PARMode) Option { return func(o *options) { o.par = mode } }
