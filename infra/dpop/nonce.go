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
func WithKey(ctx context.Context, k *Key) context.Context { return context.WithValue(ctx, keyCtx{}, k) }

// TokenTransport adds a DPoP proof to every token-endpoint request whose context carries a key
// (WithKey); others pass untouched.
type TokenTransport struct {
	Base   http.RoundTripper
	Nonces *Nonces
	Now    func() time.Time // default time.Now
}

func (t *TokenTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := cmp.Or(t.Base, http.DefaultTransport)
	k, _ := req.Context().Value(keyCtx{}).(*Key)
	if k == nil {
		return base.RoundTrip(req)
	}
	now := time.Now
	if t.Now != nil {
		now = t.Now
	}
	return Send(base, req, k, "", t.Nonces, now())
}

// Send sends req through rt with a proof signed by k (see sendSigned), learning the server's nonce. A nonce refusal (a
// token endpoint's 400, a resource server's 401) is sent once more when req's body can be read
// twice: the server checks the proof before the grant, so a refused refresh token is unspent.
func Send(rt http.RoundTripper, req *http.Request, k *Key, accessToken string, n *Nonces, now time.Time) (*http.Response, error) {
	again, replayable := Replay(req)
	resp, err := sendSigned(rt, req, k, accessToken, n, now)
	if err != nil || !replayable || !refused(resp, accessToken != "") {
		return resp, err
	}
	return sendSigned(rt, again, k, accessToken, n, now)
}

// sendSigned sends a copy of req carrying a fresh proof, with the nonce last learned from its
// server, and accessToken, when set, in the DPoP scheme (its hash in the proof).
func sendSigned(rt http.RoundTripper, req *http.Request, k *Key, accessToken string, n *Nonces, now time.Time) (*http.Response, error) {
	target := req.URL.String()
	proof, err := k.Proof(req.Method, target, accessToken, n.For(target), now)
	if err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	r := req.Clone(req.Context())
	if accessToken != "" {
		r.Header.Set("Authorization", "DPoP "+accessToken)
	}
	r.Header.Set("DPoP", proof)
	resp, err := rt.RoundTrip(r)
	if err == nil {
		n.Learn(target, resp.Header)
	}
	return resp, err
}

// maxRefusal bounds the body read to recognise a nonce refusal.
const maxRefusal = 64 << 10

// refused reports whether resp refuses the proof for want of a nonce, and then closes it; a token
// endpoint's 400 is read for its error code and left readable otherwise.
func refused(resp *http.Response, resource bool) bool {
	want := http.StatusBadRequest
	if resource {
		want = http.StatusUnauthorized
	}
	if resp.StatusCode != want || resp.Header.Get("DPoP-Nonce") == "" {
		return false
	}
	var body []byte
	if !resource { // a cut body does not parse
		body, _ = io.ReadAll(io.LimitReader(resp.Body, maxRefusal))
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(body))
	}
	if !NonceRefused(resp.StatusCode, resp.Header, body) {
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxRefusal))
	resp.Body.Close()
	return true
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
	r.Body = body
	return r, err == nil
}
