package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/waitfor"
)

// webhookBodies receives webhooks and keeps their bodies by type.
func webhookBodies(t *testing.T) (url string, of func(kind string) []string) {
	var mu sync.Mutex
	bodies := map[string][]string{}
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var e struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(body, &e)
		mu.Lock()
		bodies[e.Type] = append(bodies[e.Type], string(body))
		mu.Unlock()
	}))
	t.Cleanup(hook.Close)
	return hook.URL, func(kind string) []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), bodies[kind]...)
	}
}

// importScoped stores a first grant of the sandbox's scopes as tokenctl
// import reads it from sandbox grant: with the answer's scope, the
// scopes granted.
func (s *stack) importScoped(name string) {
	s.t.Helper()
	tok, err := sandbox.Grant(context.Background(), s.sb.OAuth2Config(s.sb.URL))
	if err != nil {
		s.t.Fatal(err)
	}
	scope, _ := tok.Extra("scope").(string)
	js, _ := json.Marshal(struct {
		AccessToken  string    `json:"access_token"`
		RefreshToken string    `json:"refresh_token"`
		Expiry       time.Time `json:"expiry"`
		Scope        string    `json:"scope"`
	}{tok.AccessToken, tok.RefreshToken, tok.Expiry, scope})
	if r := run(s.t, s.bin, "tokenctl", s.env, string(js), "import", "--connection", name); r.code != 0 {
		s.t.Fatalf("tokenctl import: exit %d: %s", r.code, r.stderr)
	}
}

// scopesOf is the connection's scopes and scopes_reduced in GET /connections.
func scopesOf(t *testing.T, s *stack) (scopes, reduced string) {
	t.Helper()
	code, body := s.do(http.MethodGet, "/connections", "")
	var page struct {
		Connections []struct {
			Scopes        string  `json:"scopes"`
			ScopesReduced *string `json:"scopes_reduced"`
		} `json:"connections"`
	}
	if code != http.StatusOK || json.Unmarshal([]byte(body), &page) != nil || len(page.Connections) != 1 {
		t.Fatalf("GET /connections: %d %s", code, body)
	}
	c := page.Connections[0]
	if c.ScopesReduced != nil {
		reduced = *c.ScopesReduced
	}
	return c.Scopes, reduced
}

// webhooksSettled reports whether every event written so far was
// delivered: the outbox is empty and no webhook job is left.
func webhooksSettled(t *testing.T, dbURL string) bool {
	conn, err := pgx.Connect(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var pending int
	err = conn.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM tokenguard_webhook_outbox) +
		(SELECT count(*) FROM river_job WHERE kind = 'tokenguard_webhook' AND state <> 'completed')`).Scan(&pending)
	return err == nil && pending == 0
}

// testScopesReduced: the connection was granted "api read"; the provider's
// refreshes grant only "api". After a refresh the connection shows
// scopes_reduced "read" in GET /connections, tokenctl status and the
// console; the worker delivers one connection.scopes_reduced webhook
// (with the missing scopes) to a real receiver, and no second one for
// the refreshes after it with the same reduction; the connection keeps
// serving tokens.
func testScopesReduced(t *testing.T, bin string) {
	hookURL, delivered := webhookBodies(t)
	s := newStack(t, bin, stackOpts{lifetime: time.Hour, skew: skew, scopes: []string{"api", "read"}, refreshScopes: []string{"api"},
		extraEnv: []string{"WEBHOOK_URL=" + hookURL, "WEBHOOK_SECRET=whsec_e2e_0123456789abcdef"}})
	s.migrate()
	const conn = "acme"
	s.importScoped(conn)
	server := s.start("server")
	s.waitHealthy(server)
	worker := s.start("worker")
	if scopes, reduced := scopesOf(t, s); scopes != "api read" || reduced != "" {
		t.Fatalf("after the import: scopes %q, scopes_reduced %q; want \"api read\" and none", scopes, reduced)
	}

	s.forceRefresh(conn)
	if scopes, reduced := scopesOf(t, s); scopes != "api read" || reduced != "read" {
		t.Errorf("after a refresh granting api: scopes %q, scopes_reduced %q; want \"api read\" and \"read\"", scopes, reduced)
	}
	waitfor.Until(t, 30*time.Second, "the scopes_reduced webhook", func() bool { return len(delivered("connection.scopes_reduced")) > 0 })
	var e struct {
		Connection string `json:"connection"`
		Data       struct {
			ScopesReduced []string `json:"scopes_reduced"`
			Scopes        []string `json:"scopes"`
			Status        string   `json:"status"`
		} `json:"data"`
	}
	if body := delivered("connection.scopes_reduced")[0]; json.Unmarshal([]byte(body), &e) != nil || e.Connection != conn ||
		strings.Join(e.Data.ScopesReduced, " ") != "read" || strings.Join(e.Data.Scopes, " ") != "api" || e.Data.Status != "active" {
		t.Errorf("webhook: %s", body)
	}

	// The same reduction again: no second webhook.
	s.forceRefresh(conn)
	waitfor.Until(t, 30*time.Second, "every event delivered", func() bool { return webhooksSettled(t, s.dbURL) })
	if n := len(delivered("connection.scopes_reduced")); n != 1 {
		t.Errorf("%d connection.scopes_reduced webhooks after two refreshes with one reduction, want 1", n)
	}

	// Still usable: the API is called with the narrowed token.
	if code, body := s.do(http.MethodGet, "/connections/"+conn+"/resource", ""); code != http.StatusOK {
		t.Errorf("GET resource with scopes reduced: %d %s", code, body)
	}
	if st := connectionStatus(t, s); st != "active" {
		t.Errorf("status %s, want active", st)
	}
	if r := run(t, s.bin, "tokenctl", s.env, "", "status"); r.code != 0 || !strings.Contains(r.stdout, conn+": ") ||
		!strings.Contains(r.stdout, "scopes_reduced: read") {
		t.Errorf("tokenctl status: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	page := consoleBody(t, consoleLogin(t, s, s.key), s, http.MethodGet, "/console/connections/"+conn, nil, http.StatusOK)
	if !strings.Contains(page, "scopes_reduced") || !strings.Contains(page, "<code>read</code>") {
		t.Errorf("the console's connection page does not show scopes_reduced read")
	}
	s.stop(worker)
	s.stop(server)
}

// testScopesUnchanged, the controls: a refresh answer without scope
// (RFC 6749 §5.1: unchanged) and one naming the granted scopes leave the
// connection without scopes_reduced, and write no scopes_reduced event.
func testScopesUnchanged(t *testing.T, bin string) {
	for _, c := range []struct {
		name string
		opts stackOpts
	}{
		{"answer without scope", stackOpts{omitRefreshScope: true}},
		{"equal scope", stackOpts{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := c.opts
			o.lifetime, o.skew, o.scopes = time.Hour, skew, []string{"api", "read"}
			s := newStack(t, bin, o)
			s.migrate()
			s.importScoped("acme")
			server := s.start("server")
			s.waitHealthy(server)
			s.forceRefresh("acme")
			if scopes, reduced := scopesOf(t, s); scopes != "api read" || reduced != "" {
				t.Errorf("after a refresh: scopes %q, scopes_reduced %q; want \"api read\" and none", scopes, reduced)
			}
			if st := s.sb.Stats(); st.Refreshes != 1 {
				t.Errorf("%d refreshes at the provider, want 1", st.Refreshes)
			}
			conn, err := pgx.Connect(context.Background(), s.dbURL)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(context.Background())
			var events int
			if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM tokenguard_webhook_outbox WHERE type = 'connection.scopes_reduced'`).
				Scan(&events); err != nil || events != 0 {
				t.Errorf("%d scopes_reduced events (%v), want none", events, err)
			}
			s.stop(server)
		})
	}
}
