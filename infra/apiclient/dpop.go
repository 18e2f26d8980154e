package apiclient

import (
	"context"
	"net/http"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/dpop"
)

// Provers hands out the DPoP key a connection's grant is bound to and this
// process's server nonces; Tokens serving sender-constrained connections implement it.
type Provers interface {
	DPoPKey(ctx context.Context, connection, jkt string) (*dpop.Key, *dpop.Nonces, error)
}

// send sends req with tok as a bearer token, or for a sender-constrained
// grant with a DPoP proof (RFC 9449 §7), retrying a nonce refusal once (§9).
func (t *Transport) send(req *http.Request, tok domain.Token) (*http.Response, error) {
	if !tok.SenderConstrained() {
		return t.base().RoundTrip(authorised(req, tok))
	}
	p, ok := t.Tokens.(Provers)
	if !ok {
		return refuse(req, domain.ErrSenderConstrained)
	}
	key, nonces, err := p.DPoPKey(req.Context(), t.Connection, tok.DPoPJKT)
	if err != nil {
		return refuse(req, err)
	}
	return dpop.Send(t.base(), req, key, tok.AccessToken.Reveal(), nonces, time.Now())
}
