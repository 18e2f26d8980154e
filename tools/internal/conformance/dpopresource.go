package conformance

import (
	"context"
	"crypto"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// DPoPResource is a protected API that accepts only DPoP-bound access
// tokens (RFC 9449 §7), verifying each request's proof with go-jose: a
// compact JWS of typ dpop+jwt, ES256, signed by the JWK in its header, for
// this method and URL (htu without query), recent (iat), never seen before
// (jti), for this very token (ath), with a nonce it handed out (§9: a new
// one every NonceTTL, the previous one still accepted, older ones refused
// with use_dpop_nonce). The token must be active at the authorization
// server (introspection) and bound to the proof's key (cnf.jkt).
type DPoPResource struct {
	IntrospectionURL string
	ClientID, Secret string        // the resource server's credentials (HTTP Basic)
	NonceTTL         time.Duration // how long a nonce is the current one; 0: 500ms

	mu       sync.Mutex
	nonce    string
	previous string
	since    time.Time // when nonce became the current one
	jtis     map[string]bool
	Counts   DPoPCounts
}

// DPoPCounts are what a DPoPResource answered.
type DPoPCounts struct {
	Accepted     int
	NonceRefused int            // use_dpop_nonce: a stale or missing nonce
	Refused      map[string]int // by reason: every other refusal
	Nonces       int            // nonces handed out
}

// Snapshot is a copy of the counts.
func (d *DPoPResource) Snapshot() DPoPCounts {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.Counts
	c.Refused = map[string]int{}
	for k, v := range d.Counts.Refused {
		c.Refused[k] = v
	}
	return c
}

type dpopClaims struct {
	JTI   string `json:"jti"`
	HTM   string `json:"htm"`
	HTU   string `json:"htu"`
	IAT   int64  `json:"iat"`
	ATH   string `json:"ath"`
	Nonce string `json:"nonce"`
}

func (d *DPoPResource) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path != Path {
		http.NotFound(w, req)
		return
	}
	scheme, token, _ := strings.Cut(req.Header.Get("Authorization"), " ")
	if !strings.EqualFold(scheme, "DPoP") || token == "" {
		d.refuse(w, "no_dpop_scheme", `DPoP error="invalid_token"`)
		return
	}
	c, jkt, reason := d.verify(req, token)
	if reason != "" {
		d.refuse(w, reason, `DPoP error="invalid_dpop_proof"`)
		return
	}
	d.mu.Lock()
	ttl := d.NonceTTL
	if ttl <= 0 {
		ttl = 500 * time.Millisecond
	}
	if d.nonce == "" || time.Since(d.since) >= ttl {
		d.rotate()
	}
	if c.Nonce == "" || (c.Nonce != d.nonce && c.Nonce != d.previous) {
		d.Counts.NonceRefused++
		nonce := d.nonce
		d.mu.Unlock()
		w.Header().Set("DPoP-Nonce", nonce)
		w.Header().Set("WWW-Authenticate", `DPoP error="use_dpop_nonce", error_description="Resource server requires nonce in DPoP proof"`)
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	d.mu.Unlock()
	bound, active, err := d.introspect(req.Context(), token)
	if err != nil {
		http.Error(w, `{"error":"introspection_failed"}`, http.StatusBadGateway)
		return
	}
	switch {
	case !active:
		d.refuse(w, "inactive_token", `DPoP error="invalid_token"`)
		return
	case bound != jkt:
		d.refuse(w, "key_mismatch", `DPoP error="invalid_token"`)
		return
	}
	d.mu.Lock()
	d.Counts.Accepted++
	nonce := d.nonce
	d.mu.Unlock()
	w.Header().Set("DPoP-Nonce", nonce)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"ok":true}`))
}

// rotate hands out a new nonce; d.mu held.
func (d *DPoPResource) rotate() {
	d.previous = d.nonce
	d.nonce = base64.RawURLEncoding.EncodeToString([]byte(time.Now().Format(time.RFC3339Nano)))
	d.since = time.Now()
	d.Counts.Nonces++
}

func (d *DPoPResource) refuse(w http.ResponseWriter, reason, challenge string) {
	d.mu.Lock()
	if d.Counts.Refused == nil {
		d.Counts.Refused = map[string]int{}
	}
	d.Counts.Refused[reason]++
	d.mu.Unlock()
	w.Header().Set("WWW-Authenticate", challenge)
	w.WriteHeader(http.StatusUnauthorized)
}

// verify checks the request's proof and returns its claims and its key's
// thumbprint, or why it is refused.
func (d *DPoPResource) verify(req *http.Request, token string) (dpopClaims, string, string) {
	var c dpopClaims
	proofs := req.Header.Values("DPoP")
	if len(proofs) != 1 {
		return c, "", "no_proof"
	}
	jws, err := jose.ParseSignedCompact(proofs[0], []jose.SignatureAlgorithm{jose.ES256})
	if err != nil || len(jws.Signatures) != 1 {
		return c, "", "malformed_proof"
	}
	h := jws.Signatures[0].Protected
	if typ, _ := h.ExtraHeaders[jose.HeaderType].(string); typ != "dpop+jwt" || h.JSONWebKey == nil || !h.JSONWebKey.IsPublic() {
		return c, "", "bad_header"
	}
	payload, err := jws.Verify(h.JSONWebKey)
	if err != nil || json.Unmarshal(payload, &c) != nil {
		return c, "", "bad_signature"
	}
	htu := "http://" + req.Host + req.URL.Path
	ath := sha256.Sum256([]byte(token))
	switch {
	case c.HTM != req.Method:
		return c, "", "htm"
	case c.HTU != htu:
		return c, "", "htu"
	case time.Since(time.Unix(c.IAT, 0)).Abs() > time.Minute:
		return c, "", "iat"
	case c.ATH != base64.RawURLEncoding.EncodeToString(ath[:]):
		return c, "", "ath"
	}
	tp, err := h.JSONWebKey.Thumbprint(crypto.SHA256)
	if err != nil {
		return c, "", "thumbprint"
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.jtis == nil {
		d.jtis = map[string]bool{}
	}
	if c.JTI == "" || d.jtis[c.JTI] {
		return c, "", "jti_replayed"
	}
	d.jtis[c.JTI] = true
	return c, base64.RawURLEncoding.EncodeToString(tp), ""
}

// introspect asks the server about token: active, and the thumbprint it
// is bound to (cnf.jkt).
func (d *DPoPResource) introspect(ctx context.Context, token string) (jkt string, active bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	form := url.Values{"token": {token}, "token_type_hint": {"access_token"}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.IntrospectionURL, strings.NewReader(form.Encode()))
	if err != nil {
		return "", false, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	req.SetBasicAuth(url.QueryEscape(d.ClientID), url.QueryEscape(d.Secret))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", false, &statusError{resp.StatusCode}
	}
	var body struct {
		Active bool `json:"active"`
		Cnf    struct {
			JKT string `json:"jkt"`
		} `json:"cnf"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return "", false, err
	}
	return body.Cnf.JKT, body.Active, nil
}
