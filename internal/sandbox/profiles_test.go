package sandbox

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// post sends a refresh_token grant by hand and returns the status and the
// decoded body (nil when the connection closed without an answer).
func (e *env) post(t *testing.T, tokenURL, rt string) (int, map[string]any) {
	t.Helper()
	form := url.Values{"grant_type": {"refresh_token"}, "refresh_token": {rt}}
	req, _ := http.NewRequestWithContext(e.ctx, http.MethodPost, tokenURL, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(e.cfg.ClientID, e.cfg.ClientSecret)
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	var body map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body
}

func TestDeadGrantAnswer(t *testing.T) {
	for _, c := range []struct {
		name   string
		answer DeadGrantAnswer
		status int
		field  string
	}{
		{"github", DeadGrantAnswer{Status: 200, Code: "bad_refresh_token"}, 200, "error"},
		{"freee", DeadGrantAnswer{Status: 401, Code: "invalid_grant"}, 401, "error"},
		{"hubspot", DeadGrantAnswer{Status: 400, Field: "status", Code: "BAD_REFRESH_TOKEN"}, 400, "status"},
		{"slack", DeadGrantAnswer{Status: 200, Code: "invalid_refresh_token", OKFalse: true}, 200, "error"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, Options{DeadGrant: &c.answer})
			tok := e.grant(t)
			e.p.RevokeAll()
			status, body := e.post(t, e.cfg.Endpoint.TokenURL, tok.RefreshToken)
			if status != c.status || body[c.field] != c.answer.Code || body["access_token"] != nil || (c.answer.OKFalse && body["ok"] != false) {
				t.Fatalf("dead grant answered %d %v", status, body)
			}
		})
	}
	// Control: without the switch, the RFC answer.
	e := newEnv(t, Options{})
	tok := e.grant(t)
	e.p.RevokeAll()
	if status, body := e.post(t, e.cfg.Endpoint.TokenURL, tok.RefreshToken); status != 400 || body["error"] != "invalid_grant" {
		t.Fatalf("strict dead grant answered %d %v", status, body)
	}
}

func TestReuseGrace(t *testing.T) {
	e := newEnv(t, Options{ReuseGrace: 300 * time.Millisecond})
	tok := e.grant(t)
	_, first := e.post(t, e.cfg.Endpoint.TokenURL, tok.RefreshToken)
	status, again := e.post(t, e.cfg.Endpoint.TokenURL, tok.RefreshToken)
	if status != 200 || again["refresh_token"] == nil || again["refresh_token"] != first["refresh_token"] {
		t.Fatalf("reuse within the grace window: %d, same answer %v", status, again["refresh_token"] == first["refresh_token"])
	}
	if s := e.p.Stats(); s.GraceReplays != 1 || s.RefreshReuse != 0 || s.Refreshes != 1 {
		t.Fatalf("stats = %+v", s)
	}
	time.Sleep(400 * time.Millisecond)
	if status, body := e.post(t, e.cfg.Endpoint.TokenURL, tok.RefreshToken); status != 400 || body["error"] != "invalid_grant" {
		t.Fatalf("reuse after the grace window: %d %v", status, body)
	}
	if s := e.p.Stats(); s.RefreshReuse != 1 {
		t.Fatalf("stats = %+v", s)
	}
	// Control: no grace, the first reuse is reuse.
	strict := newEnv(t, Options{})
	tok = strict.grant(t)
	strict.post(t, strict.cfg.Endpoint.TokenURL, tok.RefreshToken)
	if status, _ := strict.post(t, strict.cfg.Endpoint.TokenURL, tok.RefreshToken); status != 400 || strict.p.Stats().RefreshReuse != 1 {
		t.Fatalf("strict reuse answered %d, stats %+v", status, strict.p.Stats())
	}
}

func TestLostAnswer(t *testing.T) {
	for _, grace := range []time.Duration{0, time.Minute} {
		e := newEnv(t, Options{ReuseGrace: grace})
		tok := e.grant(t)
		e.p.SetRefreshFault(func() Fault { return FaultLostAnswer })
		if status, _ := e.post(t, e.cfg.Endpoint.TokenURL, tok.RefreshToken); status != 0 {
			t.Fatalf("lost answer arrived: %d", status)
		}
		e.p.SetRefreshFault(nil)
		if s := e.p.Stats(); s.Refreshes != 1 || s.LostAnswers != 1 {
			t.Fatalf("stats = %+v", s)
		}
		wantResource(t, e, tok.AccessToken, http.StatusUnauthorized) // the refresh happened
		status, body := e.post(t, e.cfg.Endpoint.TokenURL, tok.RefreshToken)
		switch {
		case grace == 0 && (status != 400 || e.p.Stats().RefreshReuse != 1):
			t.Fatalf("no grace: presenting it again = %d %v, want reuse", status, body)
		case grace > 0 && (status != 200 || body["access_token"] == nil || e.p.Stats().GraceReplays != 1):
			t.Fatalf("grace: presenting it again = %d, want the lost answer", status)
		}
	}
}

func TestRefreshAbsolute(t *testing.T) {
	e := newEnv(t, Options{RefreshAbsolute: 300 * time.Millisecond})
	tok := e.grant(t)
	next, err := e.refresh(tok.RefreshToken)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond)
	_, err = e.refresh(next.RefreshToken)
	retrieveError(t, err, "invalid_grant")
	if s := e.p.Stats(); s.RefreshReuse != 0 {
		t.Fatalf("an expired grant counted as reuse: %+v", s)
	}
}

func TestTenantAndExtraFields(t *testing.T) {
	e := newEnv(t, Options{Tenant: "c123", ExtraTokenFields: map[string]string{"instance_url": "https://acme.example"}})
	if !strings.HasSuffix(e.cfg.Endpoint.TokenURL, "/t/c123/oauth2/token") {
		t.Fatalf("token URL %s", e.cfg.Endpoint.TokenURL)
	}
	tok := e.grant(t)
	if tok.Extra("instance_url") != "https://acme.example" {
		t.Fatalf("code answer without instance_url")
	}
	for _, u := range []string{e.srv.URL + "/oauth2/token", e.srv.URL + "/t/other/oauth2/token"} {
		if status, _ := e.post(t, u, tok.RefreshToken); status != http.StatusNotFound {
			t.Fatalf("%s answered %d, want 404", u, status)
		}
	}
	next, err := e.refresh(tok.RefreshToken)
	if err != nil || next.Extra("instance_url") != "https://acme.example" {
		t.Fatalf("refresh at the tenant's URL: %v", err)
	}
}
