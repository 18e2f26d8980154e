package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/tokenguard/tokenguard"
	"github.com/tokenguard/tokenguard/domain"
)

// Provers sign DPoP proofs of a connection's key, which callers never see.
type Provers interface {
	DPoPProof(ctx context.Context, cred tokenguard.Credential, method, target, nonce string) (string, error)
	LearnDPoPNonce(target string, status int, h http.Header) (retry bool)
}

// errNoProver: the server's Tokens cannot sign proofs.
var errNoProver = errors.New("this server cannot sign DPoP proofs")

// proofView is POST /connections/{name}/dpop-proof's answer.
type proofView struct {
	AccessToken string     `json:"access_token"`
	TokenType   string     `json:"token_type"`
	DPoP        string     `json:"dpop"`
	ExpiresAt   *time.Time `json:"expires_at"`
}

// dpopProof answers POST /connections/{name}/dpop-proof
// {"method","url","nonce"}: the token and a proof for that one request
// (RFC 9449 §7), the URL under the connection's API base URL.
func (s *Server) dpopProof(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	var body struct {
		Method string `json:"method"`
		URL    string `json:"url"`
		Nonce  string `json:"nonce"`
	}
	if err := decodeBody(r, &body, true); err != nil || !validMethod(body.Method) || body.URL == "" {
		writeJSON(w, http.StatusBadRequest, errorBody{
			Error: `the body must be {"method": "GET", "url": "https://api.example.com/..."}`, Code: "bad_request", Connection: name})
		return
	}
	p, ok := s.deps.Tokens.(Provers)
	if !ok {
		s.failed(w, r, name, errNoProver)
		return
	}
	c, err := s.deps.Tokens.Credential(r.Context(), name)
	if err != nil {
		s.failed(w, r, name, err)
		return
	}
	if c.DPoPJKT == "" {
		writeJSON(w, http.StatusConflict, errorBody{
			Error: "the connection's grant is a bearer grant: GET /connections/{name}/token", Code: "not_sender_constrained", Connection: name})
		return
	}
	if err := s.underAPIBase(c.Provider, body.URL); err != nil {
		writeJSON(w, http.StatusBadRequest, errorBody{Error: err.Error(), Code: "url_not_allowed", Connection: name})
		return
	}
	proof, err := p.DPoPProof(r.Context(), c, strings.ToUpper(body.Method), body.URL, body.Nonce)
	if err != nil {
		s.failed(w, r, name, err)
		return
	}
	w.Header().Set("Pragma", "no-cache")
	writeJSON(w, http.StatusOK, proofView{AccessToken: c.Token.AccessToken, TokenType: "DPoP", DPoP: proof, ExpiresAt: utcOrNil(c.Token.Expiry)})
}

// underAPIBase checks that target is under the API base URL of
// provider's connections, the API the token and its proof are for.
func (s *Server) underAPIBase(provider, target string) error {
	base, err := s.target(provider, "/", "")
	if err != nil {
		return err
	}
	u, err := url.Parse(target)
	if err != nil || u.User != nil || u.Fragment != "" {
		return errors.New("url: not an absolute http(s) URL without credentials or fragment")
	}
	prefix := strings.TrimSuffix(base.Path, "/") + "/"
	if !strings.EqualFold(u.Scheme, base.Scheme) || !strings.EqualFold(u.Host, base.Host) ||
		!(u.Path+"/" == prefix || strings.HasPrefix(u.Path, prefix)) || strings.Contains("/"+u.Path+"/", "/../") {
		return fmt.Errorf("url: not under the connection's API base URL %s://%s%s", base.Scheme, base.Host, prefix)
	}
	return nil
}

// validMethod: an HTTP method token, as a proof's htm.
func validMethod(m string) bool {
	return m != "" && len(m) <= 16 && !strings.ContainsFunc(m, func(c rune) bool {
		return (c < 'A' || c > 'Z') && (c < 'a' || c > 'z')
	})
}

// senderConstrained refuses a DPoP-bound token, useless without a proof.
func senderConstrained(c tokenguard.Credential) error {
	if c.DPoPJKT == "" {
		return nil
	}
	return fmt.Errorf("connection %s: %w", c.Connection, domain.ErrSenderConstrained)
}

// authorize gives a proxied request cred's token: Bearer, or DPoP with a
// proof for this very request (RFC 9449 §7).
func (t *tokenTransport) authorize(req *http.Request, cred tokenguard.Credential) error {
	if cred.DPoPJKT == "" {
		req.Header.Set("Authorization", "Bearer "+cred.Token.AccessToken)
		return nil
	}
	p, ok := t.tokens.(Provers)
	if !ok {
		return errNoProver
	}
	proof, err := p.DPoPProof(req.Context(), cred, req.Method, req.URL.String(), "")
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "DPoP "+cred.Token.AccessToken)
	req.Header.Set("DPoP", proof)
	return nil
}

// nonceRefused learns the API's DPoP nonce and reports whether the answer
// refused the proof for want of it (§9).
func (t *tokenTransport) nonceRefused(req *http.Request, resp *http.Response, cred tokenguard.Credential) bool {
	p, ok := t.tokens.(Provers)
	return ok && cred.DPoPJKT != "" && p.LearnDPoPNonce(req.URL.String(), resp.StatusCode, resp.Header)
}
