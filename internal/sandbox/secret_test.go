package sandbox

import (
	"testing"
)

// A rotated client secret: with the overlap both secrets are accepted;
// after it, the old one is answered invalid_client without the refresh
// token being looked at (it stays valid, no reuse is counted).
func TestRotateClientSecret(t *testing.T) {
	e := newEnv(t, Options{ClientAuth: ClientAuthBasic})
	tok := e.grant(t)
	old := *e.cfg

	e.p.RotateClientSecret("second-secret", true)
	if e.p.ClientSecret() != "second-secret" || e.p.OAuth2Config(e.srv.URL).ClientSecret != "second-secret" {
		t.Fatalf("current secret not the rotated one")
	}
	tok, err := e.refresh(tok.RefreshToken) // old secret, during the overlap
	if err != nil {
		t.Fatalf("old secret during the overlap: %v", err)
	}
	e.cfg = e.p.OAuth2Config(e.srv.URL)
	if tok, err = e.refresh(tok.RefreshToken); err != nil {
		t.Fatalf("new secret: %v", err)
	}

	e.p.DropOldClientSecrets()
	e.cfg = &old
	if _, err := e.refresh(tok.RefreshToken); err == nil {
		t.Fatal("old secret accepted after the overlap ended")
	} else {
		retrieveError(t, err, "invalid_client")
	}
	e.cfg = e.p.OAuth2Config(e.srv.URL)
	if _, err := e.refresh(tok.RefreshToken); err != nil {
		t.Fatalf("the refresh token after an invalid_client answer: %v", err)
	}
	if s := e.p.Stats(); s.RefreshReuse != 0 {
		t.Errorf("reuse %d, want 0", s.RefreshReuse)
	}
}
