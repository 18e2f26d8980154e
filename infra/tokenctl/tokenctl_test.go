package tokenctl

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

func TestReadGrant(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	g, err := readGrant(strings.NewReader(`{"access_token":"at-1","token_type":"Bearer","refresh_token":"rt-1","expiry":"2026-01-01T01:00:00Z"}`), now)
	if err != nil || g.AccessToken.Reveal() != "at-1" || g.RefreshToken.Reveal() != "rt-1" || !g.Expiry.Equal(now.Add(time.Hour)) {
		t.Fatalf("readGrant = %+v, %v", g, err)
	}
	// A raw token-endpoint answer (expires_in) works too.
	g, err = readGrant(strings.NewReader(`{"access_token":"at-1","refresh_token":"rt-1","expires_in":60}`), now)
	if err != nil || !g.Expiry.Equal(now.Add(time.Minute)) {
		t.Fatalf("expires_in: %+v, %v", g, err)
	}
	// The answer's scope is the scopes granted; without one, none is named.
	g, err = readGrant(strings.NewReader(`{"access_token":"at-1","refresh_token":"rt-1","scope":"api read"}`), now)
	if err != nil || !g.ScopeNamed || g.Scope != "api read" {
		t.Fatalf("scope: %+v, %v", g, err)
	}
	if g, _ = readGrant(strings.NewReader(`{"access_token":"at-1","refresh_token":"rt-1"}`), now); g.ScopeNamed {
		t.Errorf("no scope read as %q", g.Scope)
	}
	for in, want := range map[string]string{
		``:                               "no token on stdin",
		`{"access_token":"at-secret",`:   "truncated JSON",
		`{"access_token":"at-secret" x}`: "invalid JSON at byte",
		`{"access_token":1}`:             `field "access_token" must be a string`,
		`{"access_token":"a","refresh_token":"r"} {}`:                  "more than one JSON value",
		`{"access_token":"at-secret","expiry":"2026-01-01T00:00:00Z"}`: "refresh_token is empty",
		`{"refresh_token":"rt-secret"}`:                                "access_token is empty",
	} {
		_, err := readGrant(strings.NewReader(in), now)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("readGrant(%q) err = %v, want %q", in, err, want)
			continue
		}
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("readGrant(%q) error shows input: %v", in, err)
		}
	}
	_, err = readGrant(strings.NewReader(`{"access_token":"a"}`), now)
	if !errors.Is(err, domain.ErrInvalidToken) {
		t.Errorf("err = %v, want ErrInvalidToken", err)
	}
}
