package sandbox

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// revoke posts an RFC 7009 revocation with HTTP Basic client
// authentication and returns the status.
func (e *env) revoke(t *testing.T, token, secret string) int {
	t.Helper()
	form := url.Values{"token": {token}, "token_type_hint": {"refresh_token"}}
	req, err := http.NewRequest(http.MethodPost, RevocationURL(e.srv.URL), strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(e.cfg.ClientID, secret)
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// A revoked refresh token is dead (invalid_grant, not counted as reuse)
// and so is its grant's access token; another grant is untouched. The
// revocation is counted; a wrong client secret revokes nothing.
func TestRevocation(t *testing.T) {
	e := newEnv(t, Options{})
	tok, other := e.grant(t), e.grant(t)

	if got := e.revoke(t, tok.RefreshToken, "wrong"); got != http.StatusUnauthorized {
		t.Fatalf("revocation with a wrong secret: %d, want 401", got)
	}
	if n := e.p.Stats().Revocations; n != 0 {
		t.Fatalf("revocations after a refused one: %d", n)
	}
	wantResource(t, e, tok.AccessToken, http.StatusOK)

	if got := e.revoke(t, tok.RefreshToken, e.cfg.ClientSecret); got != http.StatusOK {
		t.Fatalf("revocation: %d, want 200", got)
	}
	if n := e.p.Stats().Revocations; n != 1 {
		t.Errorf("revocations: %d, want 1", n)
	}
	_, err := e.refresh(tok.RefreshToken)
	retrieveError(t, err, "invalid_grant")
	wantResource(t, e, tok.AccessToken, http.StatusUnauthorized)
	if s := e.p.Stats(); s.RefreshReuse != 0 {
		t.Errorf("a revoked refresh token counted as reuse: %+v", s)
	}
	if _, err := e.refresh(other.RefreshToken); err != nil {
		t.Errorf("another grant after the revocation: %v", err)
	}

	// RFC 7009 §2.2: an invalid token is answered 200.
	if got := e.revoke(t, "not-a-token", e.cfg.ClientSecret); got != http.StatusOK {
		t.Errorf("revocation of an unknown token: %d, want 200", got)
	}
}

// A refresh token rotated away is no handle on its grant any more:
// revoking it answers 200 and the grant lives on. That is why a
// revocation must present the current refresh token (tokenctl disconnect
// reads it under the connection's lock).
func TestRevokingARotatedTokenLeavesTheGrant(t *testing.T) {
	e := newEnv(t, Options{})
	tok := e.grant(t)
	next, err := e.refresh(tok.RefreshToken)
	if err != nil {
		t.Fatal(err)
	}
	if got := e.revoke(t, tok.RefreshToken, e.cfg.ClientSecret); got != http.StatusOK {
		t.Fatalf("revocation of a rotated token: %d", got)
	}
	if _, err := e.refresh(next.RefreshToken); err != nil {
		t.Errorf("the grant died with its rotated-away token: %v", err)
	}
}
