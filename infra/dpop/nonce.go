package dpop

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// Nonces remembers the last DPoP-Nonce each origin handed out (RFC 9449 §8, §9) for the next
// proof to it. Safe for concurrent use; one per process.
type Nonces struct{ m sync.Map }

func origin(target string) string {
	u, err := url.Parse(target)
	if err != nil {
		return ""
	}
	return strings.ToLower(u.Scheme + "://" + u.Host)
}

// For is the nonce last learned from target's server; "" when none.
func (n *Nonces) For(target string) string {
	if n == nil {
		return ""
	}
	v, _ := n.m.Load(origin(target))
	s, _ := v.(string)
	return s
}

// Learn keeps the DPoP-Nonce an answer from target's server carries, if any; true if it did.
func (n *Nonces) Learn(target string, h http.Header) bool {
	v := h.Get("DPoP-Nonce")
	if n == nil || v == "" {
		return false
	}
	n.m.Store(origin(target), v)
	return true
}

// NonceRefused reports whether an answer refuses a proof for want of the server's nonce and gives
// one to retry with: a token endpoint's 400 use_dpop_nonce (§8), a resource server's 401 whose
// WWW-Authenticate says error="use_dpop_nonce" (§9). body may be nil for a 401.
func NonceRefused(status int, h http.Header, body []byte) bool {
	if h.Get("DPoP-Nonce") == "" {
		return false
	}
	switch status {
	case http.StatusUnauthorized:
		return strings.Contains(h.Get("WWW-Authenticate"), "use_dpop_nonce")
	case http.StatusBadRequest:
		var e struct {
			Error string `json:"error"`
		}
		return json.Unmarshal(body, &e) == nil && e.Error == "use_dpop_nonce"
	}
	return false
}

type keyCtx struct{}

// WithKey makes token requests sent under ctx through a TokenTransport carry proofs signed by k.
func WithKey(ctx context.Context, k *Key) context.Context {
	return context.WithValue(ctx, keyCtx{}, k)
}

// KeyFrom is the key WithKey put in ctx, or nil.
func KeyFrom(ctx context.Context) *Key {
	k, _ := ctx.Value(keyCtx{}).(*Key)
	return k
}

// TokenTransport adds a DPoP proof to every token-endpoint request whose context carries a key
// (WithKey); others pass untouched. A nonce refusal is retried once: the server checks the proof
// before the grant, so the refused request's refresh token or code is unspent.
type TokenTransport struct {
	Base   http.RoundTripper
	Nonces *Nonces
	Now    func() time.Time // default time.Now
}

// maxRefusal bounds the body read to recognise a nonce refusal.
const maxRefusal = 64 << 10

func (t *TokenTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	k := KeyFrom(req.Context())
	if k == nil {
		return t.base().RoundTrip(req)
	}
	retry, replayable := Replay(req)
	resp, err := t.send(req, k)
	if err != nil || resp.StatusCode != http.StatusBadRequest || resp.Header.Get("DPoP-Nonce") == "" || !replayable {
		return resp, err
	}
	body, rerr := io.ReadAll(io.LimitReader(resp.Body, maxRefusal))
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if rerr != nil || !NonceRefused(resp.StatusCode, resp.Header, body) {
		return resp, nil
	}
	return t.send(retry, k)
}

func (t *TokenTransport) send(req *http.Request, k *Key) (*http.Response, error) {
	target := req.URL.String()
	proof, err := k.Proof(req.Method, target, "", t.Nonces.For(target), t.now())
	if err != nil {
		return nil, err
	}
	r := req.Clone(req.Context())
	r.Header.Set("DPoP", proof)
	resp, err := t.base().RoundTrip(r)
	if err == nil {
		t.Nonces.Learn(target, resp.Header)
	}
	return resp, err
}

func (t *TokenTransport) base() http.RoundTripper { return cmp.Or(t.Base, http.DefaultTransport) }

func (t *TokenTransport) now() time.Time {
	if t.Now == nil {
		return time.Now()
	}
	return t.Now()
}

// Authorize returns a copy of req that carries accessToken in the DPoP scheme with a fresh proof
// (ath included) for that request, with the nonce last learned from its server.
func Authorize(req *http.Request, k *Key, accessToken string, n *Nonces, now time.Time) (*http.Request, error) {
	target := req.URL.String()
	proof, err := k.Proof(req.Method, target, accessToken, n.For(target), now)
	if err != nil {
		return nil, err
	}
	r := req.Clone(req.Context())
	r.Header.Set("Authorization", "DPoP "+accessToken)
	r.Header.Set("DPoP", proof)
	return r, nil
}

// Replay prepares a second copy of req for a retry; false when its body cannot be read twice.
func Replay(req *http.Request) (*http.Request, bool) {
	r := req.Clone(req.Context())
	if req.Body == nil || req.Body == http.NoBody {
		return r, true
	}
	if req.GetBody == nil {
		return nil, false
	}
	body, err := req.GetBody()
	if err != nil {
		return nil, false
	}
	r.Body = body
	return r, true
}
