package apiclient

import (
	"context"
	"io"
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
	again, replayable := dpop.Replay(req)
	resp, err := t.bound(req, key, nonces, tok)
	if err != nil || !replayable || !dpop.NonceRefused(resp.StatusCode, resp.Header, nil) {
		return resp, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return t.bound(again, key, nonces, tok)
}

func (t *Transport) bound(req *http.Request, key *dpop.Key, nonces *dpop.Nonces, tok domain.Token) (*http.Response, error) {
	r, err := dpop.Authorize(req, key, tok.AccessToken.Reveal(), nonces, time.Now())
	if err != nil {
		return refuse(req, err)
	}
	resp, err := t.base().RoundTrip(r)
	if err == nil {
		nonces.Learn(req.URL.String(), resp.Header)
	}
	return resp, err
}
