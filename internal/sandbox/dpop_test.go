package sandbox

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/infra/dpop"
)

// dpopCtx is e's context whose token requests carry proofs of k.
func (e *env) dpopCtx(k *dpop.Key) context.Context {
	hc := &http.Client{Transport: &dpop.TokenTransport{Base: e.srv.Client().Transport, Nonces: &dpop.Nonces{}}}
	return dpop.WithKey(context.WithValue(e.ctx, oauth2.HTTPClient, hc), k)
}

// dpopResource calls /resource in the DPoP scheme with a proof signed by
// k for target (the resource's URL unless set), or with proof when set.
func (e *env) dpopResource(t *testing.T, at string, k *dpop.Key, target, proof string) int {
	t.Helper()
	if target == "" {
		target = e.srv.URL + "/resource"
	}
	if proof == "" {
		var err error
		if proof, err = k.Proof(http.MethodGet, target, at, "", time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	req, _ := http.NewRequest(http.MethodGet, e.srv.URL+"/resource", nil)
	req.Header.Set("Authorization", "DPoP "+at)
	req.Header.Set("DPoP", proof)
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// A code exchange with a proof binds the grant to the proof's key: its
// access tokens work only in the DPoP scheme with a fresh proof of that
// key for this request (not as bearer tokens, not with another key's, a
// replayed or a misdirected proof); its refreshes only with a proof of
// that key, refused before the refresh token is spent; reuse of its
// rotated tokens is counted as the bound grant's. A grant without a proof
// stays a bearer grant.
func TestDPoPBoundGrant(t *testing.T) {
	e := newEnv(t, Options{})
	key, _ := dpop.Generate()
	other, _ := dpop.Generate()
	tok, err := Grant(e.dpopCtx(key), e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.EqualFold(tok.Type(), "DPoP") {
		t.Fatalf("token_type of a bound grant = %q, want DPoP", tok.Type())
	}
	at := tok.AccessToken
	if got := e.resource(t, at, ""); got != http.StatusUnauthorized {
		t.Errorf("bound access token as a bearer token: %d, want 401", got)
	}
	if got := e.dpopResource(t, at, other, "", ""); got != http.StatusUnauthorized {
		t.Errorf("another key's proof: %d, want 401", got)
	}
	if got := e.dpopResource(t, at, key, e.srv.URL+"/elsewhere", ""); got != http.StatusUnauthorized {
		t.Errorf("a proof for another URL: %d, want 401", got)
	}
	proof, _ := key.Proof(http.MethodGet, e.srv.URL+"/resource", at, "", time.Now())
	if got := e.dpopResource(t, at, key, "", proof); got != http.StatusOK {
		t.Errorf("the key's proof: %d, want 200", got)
	}
	if got := e.dpopResource(t, at, key, "", proof); got != http.StatusUnauthorized {
		t.Errorf("the same proof again (its jti seen): %d, want 401", got)
	}
	stale, _ := key.Proof(http.MethodGet, e.srv.URL+"/resource", at, "", time.Now().Add(-2*proofWindow))
	if got := e.dpopResource(t, at, key, "", stale); got != http.StatusUnauthorized {
		t.Errorf("an old proof (iat): %d, want 401", got)
	}
	refused := e.p.Stats().DPoPRefused

	_, err = e.refreshCtx(e.dpopCtx(other), tok.RefreshToken)
	retrieveError(t, err, "invalid_dpop_proof")
	_, err = e.refresh(tok.RefreshToken)
	retrieveError(t, err, "invalid_dpop_proof")
	if s := e.p.Stats(); s.DPoPRefused != refused+2 || s.RefreshReuse != 0 || s.Refreshes != 0 {
		t.Fatalf("refreshes without the key's proof: %+v", s)
	}
	next, err := e.refreshCtx(e.dpopCtx(key), tok.RefreshToken)
	if err != nil {
		t.Fatalf("refresh with the key's proof after the refused ones (the token must be unspent): %v", err)
	}
	if !strings.EqualFold(next.Type(), "DPoP") {
		t.Errorf("token_type of a bound refresh = %q", next.Type())
	}
	if got := e.dpopResource(t, next.AccessToken, key, "", ""); got != http.StatusOK {
		t.Errorf("the refreshed access token with the key's proof: %d", got)
	}
	_, err = e.refreshCtx(e.dpopCtx(key), tok.RefreshToken)
	retrieveError(t, err, "invalid_grant")
	if s := e.p.Stats(); s.DPoPBound != 1 || s.DPoPRefreshes != 1 || s.DPoPReuse != 1 || s.RefreshReuse != 1 {
		t.Errorf("stats: %+v, want 1 bound grant, 1 refresh, 1 reuse", s)
	}

	bearer := e.grant(t)
	if !strings.EqualFold(bearer.Type(), "bearer") {
		t.Errorf("a grant without a proof: token_type %q", bearer.Type())
	}
	wantResource(t, e, bearer.AccessToken, http.StatusOK)
	if got := e.dpopResource(t, bearer.AccessToken, key, "", ""); got != http.StatusUnauthorized {
		t.Errorf("a bearer token in the DPoP scheme: %d, want 401", got)
	}
	if _, err := e.refresh(bearer.RefreshToken); err != nil {
		t.Errorf("a bearer grant's refresh: %v", err)
	}
}
