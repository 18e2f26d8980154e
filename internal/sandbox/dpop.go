package sandbox

import (
	"crypto"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/ory/fosite"
)

// DPoP (RFC 9449) at the sandbox. A code exchange that carries a proof
// binds the grant to the proof's key (its RFC 7638 thumbprint) and is
// answered token_type DPoP; from then on every refresh of that grant and
// every /resource call with its access tokens must carry a proof of that
// very key, or it is refused before anything is spent. A grant exchanged
// without a proof stays a bearer grant. Unlike RFC 9449 §5 the sandbox
// binds a confidential client's refresh tokens too, as the AT Protocol
// binds every client's: a refresh signed with another key is refused
// (400 invalid_dpop_proof) and its refresh token stays unspent. It asks
// for no nonces.
//
// A proof is checked with go-jose: a compact JWS of typ dpop+jwt, ES256,
// signed by the public JWK in its header, for this method (htm) and URL
// without query (htu), issued within a minute (iat), with a jti never
// seen before and, at /resource, the access token's hash (ath).
type dpopState struct {
	mu     sync.Mutex
	bound  map[string]string    // grant (fosite request id) -> thumbprint
	jtis   map[string]time.Time // seen, until they are too old to pass iat
	pruned time.Time            // when jtis was last cleared of those
}

// proofWindow is how far a proof's iat may be from now.
const proofWindow = time.Minute

var errDPoPProof = &fosite.RFC6749Error{ErrorField: "invalid_dpop_proof", CodeField: http.StatusBadRequest,
	DescriptionField: "The DPoP proof is missing, invalid, or not of the key the grant is bound to."}

func (d *dpopState) bindTo(grant, jkt string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.bound == nil {
		d.bound = map[string]string{}
	}
	d.bound[grant] = jkt
}

// boundTo is the thumbprint grant is bound to; "" for a bearer grant.
func (d *dpopState) boundTo(grant string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.bound[grant]
}

type proofClaims struct {
	JTI string `json:"jti"`
	HTM string `json:"htm"`
	HTU string `json:"htu"`
	IAT int64  `json:"iat"`
	ATH string `json:"ath"`
}

// verify checks r's proof, for accessToken when not "" (ath), and returns
// its key's thumbprint, or "" when it is refused.
func (d *dpopState) verify(r *http.Request, accessToken string) string {
	proofs := r.Header.Values("DPoP")
	if len(proofs) != 1 {
		return ""
	}
	jws, err := jose.ParseSignedCompact(proofs[0], []jose.SignatureAlgorithm{jose.ES256})
	if err != nil || len(jws.Signatures) != 1 {
		return ""
	}
	h := jws.Signatures[0].Protected
	if typ, _ := h.ExtraHeaders[jose.HeaderType].(string); typ != "dpop+jwt" || h.JSONWebKey == nil || !h.JSONWebKey.IsPublic() {
		return ""
	}
	payload, err := jws.Verify(h.JSONWebKey)
	var c proofClaims
	if err != nil || json.Unmarshal(payload, &c) != nil {
		return ""
	}
	scheme := "http://"
	if r.TLS != nil {
		scheme = "https://"
	}
	ath := ""
	if accessToken != "" {
		sum := sha256.Sum256([]byte(accessToken))
		ath = base64.RawURLEncoding.EncodeToString(sum[:])
	}
	now := time.Now()
	if c.HTM != r.Method || c.HTU != scheme+r.Host+r.URL.Path || now.Sub(time.Unix(c.IAT, 0)).Abs() > proofWindow || c.ATH != ath || c.JTI == "" {
		return ""
	}
	tp, err := h.JSONWebKey.Thumbprint(crypto.SHA256)
	if err != nil {
		return ""
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, seen := d.jtis[c.JTI]; seen {
		return ""
	}
	if d.jtis == nil {
		d.jtis = map[string]time.Time{}
	}
	if now.Sub(d.pruned) > proofWindow {
		for j, at := range d.jtis {
			if now.Sub(at) > 2*proofWindow {
				delete(d.jtis, j)
			}
		}
		d.pruned = now
	}
	d.jtis[c.JTI] = now
	return base64.RawURLEncoding.EncodeToString(tp)
}

// accessToken is r's access token and whether it came in the DPoP scheme.
func accessToken(r *http.Request) (token string, dpop, ok bool) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	token = strings.TrimSpace(token)
	switch {
	case !ok || token == "":
		return "", false, false
	case strings.EqualFold(scheme, "DPoP"):
		return token, true, true
	case strings.EqualFold(scheme, "Bearer"):
		return token, false, true
	}
	return "", false, false
}
