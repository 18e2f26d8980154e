package tokenguard

import (
	"crypto"
	"encoding/json"
	"slices"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/clientkey"
)

// WithClientKey authenticates the client of New's oauth2.Config with
// private_key_jwt (RFC 7523 §2.2), assertions signed with signer (EC P-256 or
// RSA of at least 2048 bits), instead of its secret. ClientJWKS serves its public half.
func WithClientKey(signer crypto.Signer) Option { return func(o *options) { o.clientKey = signer } }

// ClientJWKS is the JSON Web Key Set of the client keys in use
// ({"keys":[]} when none), for GET /.well-known/jwks.json.
func (t *Tokens) ClientJWKS() []byte {
	set := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{}}
	for _, k := range append([]*clientkey.Key{t.clientKey}, t.providers.ClientKeys()...) {
		if k != nil && !slices.ContainsFunc(set.Keys, func(j jose.JSONWebKey) bool { return j.KeyID == k.KID() }) {
			set.Keys = append(set.Keys, k.PublicJWK())
		}
	}
	b, _ := json.Marshal(set)
	return b
}

// WithResource names the resource server (RFC 8707) of the access tokens
// of New's oauth2.Config, sent on its authorization and token requests.
func WithResource(url string) Option { return func(o *options) { o.resource = url } }

// PARMode says when the connect flow pushes its authorization request
// (RFC 9126); PARAuto, the default, when the provider requires it.
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

// WithPAR says when the connect flow of New's oauth2.Config pushes its
// authorization request (RFC 9126), so that the browser's URL carries only
// client_id and request_uri. A mode ParsePARMode refuses makes New fail.
func WithPAR(mode PARMode) Option { return func(o *options) { o.par = mode } }
