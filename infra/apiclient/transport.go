package apiclient

import (
	"cmp"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/dpop"
)

// Transport authorises every request with one connection's access token. On a 401 saying the token
// was revoked (Revoked; typically another process's refresh) it sends a replayable request once
// more with a newer token. Any other answer, and a second 401, reach the caller unchanged.
type Transport struct {
	Tokens     Tokens
	Connection string
	Base       http.RoundTripper // http.DefaultTransport when nil
}

// tokenError carries a Tokens error through http.Client, which would bury it in a *url.Error.
type tokenError struct{ err error }

func (e *tokenError) Error() string { return e.err.Error() }
func (e *tokenError) Unwrap() error { return e.err }

// refuse fails a request with err from Tokens, closing its body as a RoundTripper must.
func refuse(req *http.Request, err error) (*http.Response, error) {
	if req.Body != nil {
		req.Body.Close()
	}
	return nil, &tokenError{err}
}

func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	tok, err := t.Tokens.Token(req.Context(), t.Connection)
	if err != nil {
		return refuse(req, err)
	}
	retry, replayable := dpop.Replay(req)
	resp, err := t.send(req, tok)
	if err != nil || resp.StatusCode != http.StatusUnauthorized || !Revoked(resp.Header) || !replayable {
		return resp, err
	}
	next, ferr := t.Tokens.ForceRefresh(req.Context(), t.Connection, tok.Version)
	if ferr != nil && !errors.Is(ferr, domain.ErrNeedsReauth) {
		// No newer token (rate limited, provider down...): the caller gets the API's own 401.
		return resp, nil
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if ferr != nil {
		// The refresh found the grant revoked: that, not the API's 401, is what the caller must hear.
		return nil, &tokenError{ferr}
	}
	return t.send(retry, next)
}

// Provers hands out the DPoP key a connection's grant is bound to and this
// process's server nonces; Tokens serving sender-constrained connections implement it.
type Provers interface {
	DPoPKey(ctx context.Context, connection, jkt string) (*dpop.Key, *dpop.Nonces, error)
}

// send sends req with tok as a bearer token, or for a sender-constrained
// grant with a DPoP proof (RFC 9449 §7), retrying a nonce refusal once (§9).
func (t *Transport) send(req *http.Request, tok domain.Token) (*http.Response, error) {
	if !tok.SenderConstrained() {
		r := req.Clone(req.Context()) // a RoundTripper must not modify its request
		r.Header.Set("Authorization", "Bearer "+tok.AccessToken.Reveal())
		return t.base().RoundTrip(r)
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

func (t *Transport) base() http.RoundTripper { return cmp.Or(t.Base, http.DefaultTransport) }

// Revoked reports whether a 401 says the token itself is no good (RFC 6750 §3.1 invalid_token, or
// no error code at all) rather than, say, missing a scope.
func Revoked(h http.Header) bool {
	c := strings.ToLower(h.Get("WWW-Authenticate"))
	return !strings.Contains(c, "error=") || strings.Contains(c, `error="invalid_token"`) || strings.Contains(c, "error=invalid_token")
}
