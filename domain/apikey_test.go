package domain

import (
	"errors"
	"strings"
	"testing"
)

func TestKeyAccess(t *testing.T) {
	all := KeyAccess{}
	if !all.Has(ScopeAdmin) || !all.AllowsConnection("anything") {
		t.Error("a key without scopes or patterns (made before scopes) must keep every right")
	}
	none := KeyAccess{Scopes: []Scope{}, Connections: []string{}}
	if none.Has(ScopeConnectionsRead) || none.AllowsConnection("acme") {
		t.Error("empty lists grant nothing")
	}
	a := KeyAccess{Scopes: []Scope{ScopeTokenRead}, Connections: []string{"tenant-a-*", "solo"}}
	for name, want := range map[string]bool{"tenant-a-crm": true, "tenant-a-": true, "solo": true, "tenant-b-crm": false, "xtenant-a-1": false, "solo2": false} {
		if got := a.AllowsConnection(name); got != want {
			t.Errorf("AllowsConnection(%q) = %t", name, got)
		}
	}
	if !a.Has(ScopeTokenRead) || a.Has(ScopeAPICall) {
		t.Error("Has")
	}
	if s, err := ParseScopes([]string{"token:read", " admin", "token:read"}); err != nil || len(s) != 2 {
		t.Errorf("ParseScopes = %v, %v", s, err)
	}
	for _, bad := range [][]string{{"root"}, {}, {""}, {"token:read", "TOKEN:READ"}} {
		if _, err := ParseScopes(bad); !errors.Is(err, ErrInvalidKeyAccess) || strings.Contains(err.Error(), "TOKEN") || strings.Contains(err.Error(), "root") {
			t.Errorf("ParseScopes(%q) = %v", bad, err)
		}
	}
	for _, bad := range []string{"", "a,b", "a b", "[x", strings.Repeat("a", MaxPatternLength+1), "é"} {
		if err := ValidateConnectionPattern(bad); !errors.Is(err, ErrInvalidKeyAccess) {
			t.Errorf("ValidateConnectionPattern(%q) = %v", bad, err)
		}
	}
	if !MatchesNoName("tenant-a/*") || MatchesNoName("tenant-a-*") || MatchesNoName("[a-c]x?") {
		t.Error("MatchesNoName")
	}
}

func TestValidateAccount(t *testing.T) {
	for _, ok := range []string{"", "user-42", "1234567890", "jörg@example.com", strings.Repeat("a", MaxAccountLength)} {
		if err := ValidateAccount(ok); err != nil {
			t.Errorf("ValidateAccount(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{strings.Repeat("a", MaxAccountLength+1), "a\nlevel=ERROR msg=forged", "a\x00", "\x1b[31mred", "a\u202eb", "\xff"} {
		err := ValidateAccount(bad)
		if !errors.Is(err, ErrInvalidAccount) || (len(bad) > 3 && strings.Contains(err.Error(), bad)) {
			t.Errorf("ValidateAccount(%q) = %v", bad, err)
		}
	}
}

func TestCheckURL(t *testing.T) {
	for raw, want := range map[string]error{
		"https://idp.example/token": nil, "http://127.0.0.1:9/x": nil, "http://localhost/x": nil, "http://[::1]:8/x": nil,
		"http://idp.example/token": ErrInsecureURL, "http://10.0.0.1/x": ErrInsecureURL, "http://localhost.evil.example/": ErrInsecureURL,
		"/token": ErrNotHTTPURL, "ftp://x/": ErrNotHTTPURL, "https:///x": ErrNotHTTPURL,
	} {
		if err := CheckURL(raw, false); !errors.Is(err, want) && !(err == nil && want == nil) {
			t.Errorf("CheckURL(%q) = %v, want %v", raw, err, want)
		}
	}
	if err := CheckURL("http://idp.example/token", true); err != nil {
		t.Errorf("ALLOW_INSECURE_URLS: %v", err)
	}
	p := Provider{Name: "p", ClientID: "c", TokenURL: "https://idp.example/token", APIBaseURL: "http://api.example"}
	if field, err := p.CheckURLs(false); field != "API base URL" || !errors.Is(err, ErrInsecureURL) || !errors.Is(err, ErrInvalidProvider) {
		t.Errorf("CheckURLs = %q, %v", field, err)
	}
}
