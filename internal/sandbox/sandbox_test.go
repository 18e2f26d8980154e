package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/oauth2"
)

type env struct {
	p   *Provider
	srv *httptest.Server
	cfg *oauth2.Config
	ctx context.Context // carries srv.Client() for golang.org/x/oauth2
}

func newEnv(t *testing.T, opts Options) *env {
	t.Helper()
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p.Handler())
	t.Cleanup(srv.Close)
	return &env{
		p:   p,
		srv: srv,
		cfg: p.OAuth2Config(srv.URL),
		ctx: context.WithValue(t.Context(), oauth2.HTTPClient, srv.Client()),
	}
}

func (e *env) grant(t *testing.T) *oauth2.Token {
	t.Helper()
	tok, err := Grant(e.ctx, e.cfg)
	if err != nil {
		t.Fatalf("Grant: %v", err)
	}
	if tok.AccessToken == "" || tok.RefreshToken == "" {
		t.Fatalf("Grant: want access and refresh token, got access=%t refresh=%t", tok.AccessToken != "", tok.RefreshToken != "")
	}
	return tok
}

func (e *env) refresh(rt string) (*oauth2.Token, error) {
	return e.refreshCtx(e.ctx, rt)
}

func (e *env) refreshCtx(ctx context.Context, rt string) (*oauth2.Token, error) {
	return e.cfg.TokenSource(ctx, &oauth2.Token{RefreshToken: rt}).Token()
}

// resource calls GET /resource and returns the status code.
func (e *env) resource(t *testing.T, at, userAgent string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(e.ctx, http.MethodGet, e.srv.URL+"/resource", nil)
	if err != nil {
		t.Fatal(err)
	}
	if at != "" {
		req.Header.Set("Authorization", "Bearer "+at)
	}
	if userAgent != "" {
		req.Header.Set("User-Agent", userAgent)
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("resource body: %v", err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
		if body["ok"] != true || body["subject"] != Subject {
			t.Errorf("resource 200 body = %v", body)
		}
	case http.StatusUnauthorized:
		if got := resp.Header.Get("WWW-Authenticate"); got != `Bearer error="invalid_token"` {
			t.Errorf("WWW-Authenticate = %q", got)
		}
		if body["error"] != "invalid_token" {
			t.Errorf("resource 401 body = %v", body)
		}
	}
	return resp.StatusCode
}

func wantResource(t *testing.T, e *env, at string, want int) {
	t.Helper()
	if got := e.resource(t, at, ""); got != want {
		t.Errorf("GET /resource = %d, want %d", got, want)
	}
}

// retrieveError asserts err is an *oauth2.RetrieveError with the given code
// and returns it.
func retrieveError(t *testing.T, err error, code string) *oauth2.RetrieveError {
	t.Helper()
	var re *oauth2.RetrieveError
	if !errors.As(err, &re) {
		t.Fatalf("want *oauth2.RetrieveError %q, got %v", code, err)
	}
	if re.ErrorCode != code {
		t.Fatalf("ErrorCode = %q, want %q (status %d)", re.ErrorCode, code, re.Response.StatusCode)
	}
	return re
}

func TestGrantAndResource(t *testing.T) {
	e := newEnv(t, Options{})
	tok := e.grant(t)
	if d := time.Until(tok.Expiry); d < time.Hour-5*time.Second || d > time.Hour+5*time.Second {
		t.Errorf("expiry in %v, want ~1h", d)
	}
	if tok.TokenType != "bearer" {
		t.Errorf("token_type = %q", tok.TokenType)
	}
	wantResource(t, e, tok.AccessToken, http.StatusOK)
	wantResource(t, e, "", http.StatusUnauthorized)
	wantResource(t, e, "garbage", http.StatusUnauthorized)
	// A refresh token is not an access token.
	wantResource(t, e, tok.RefreshToken, http.StatusUnauthorized)

	s := e.p.Stats()
	if s.CodeExchanges != 1 || s.ResourceOK != 1 || s.Resource401 != 3 {
		t.Errorf("stats = %+v", s)
	}
}

func TestExpiresInMatchesLifespan(t *testing.T) {
	e := newEnv(t, Options{AccessTokenLifespan: 2 * time.Second})
	tok := e.grant(t)
	if got := tok.Extra("expires_in"); got != float64(2) {
		t.Errorf("expires_in = %v, want 2", got)
	}
	tok, err := e.refresh(tok.RefreshToken)
	if err != nil {
		t.Fatal(err)
	}
	if got := tok.Extra("expires_in"); got != float64(2) {
		t.Errorf("refresh expires_in = %v, want 2", got)
	}
}

func TestOmitExpiresIn(t *testing.T) {
	e := newEnv(t, Options{AccessTokenLifespan: 300 * time.Millisecond, OmitExpiresIn: true})
	tok := e.grant(t)
	next, err := e.refresh(tok.RefreshToken)
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range []*oauth2.Token{tok, next} {
		if tk.Extra("expires_in") != nil || !tk.Expiry.IsZero() {
			t.Errorf("expires_in = %v, expiry %v: want neither", tk.Extra("expires_in"), tk.Expiry)
		}
	}
	// The token still expires at the provider: the client learns it from a 401.
	wantResource(t, e, next.AccessToken, http.StatusOK)
	time.Sleep(400 * time.Millisecond)
	wantResource(t, e, next.AccessToken, http.StatusUnauthorized)
}

func TestClientSecretPost(t *testing.T) {
	e := newEnv(t, Options{})
	e.cfg.Endpoint.AuthStyle = oauth2.AuthStyleInParams
	tok := e.grant(t)
	next, err := e.refresh(tok.RefreshToken)
	if err != nil {
		t.Fatalf("refresh with client_secret_post: %v", err)
	}

	// A failed client authentication is rejected before the store is
	// touched: the refresh token stays valid.
	e.cfg.ClientSecret = "wrong"
	_, err = e.refresh(next.RefreshToken)
	retrieveError(t, err, "invalid_client")
	if s := e.p.Stats(); s.Refreshes != 1 || s.RefreshRejected != 1 || s.RefreshReuse != 0 {
		t.Errorf("stats = %+v", s)
	}
	e.cfg.ClientSecret = "tokenguard-secret"
	if _, err := e.refresh(next.RefreshToken); err != nil {
		t.Fatalf("refresh after failed client auth: %v", err)
	}
}

// A client restricted to one authentication method is rejected with
// invalid_client when it uses the other, before its refresh token is
// looked at: the token stays valid.
func TestClientAuthRestricted(t *testing.T) {
	for _, tc := range []struct {
		method      string
		other       oauth2.AuthStyle
		otherName   string
		configStyle oauth2.AuthStyle
	}{
		{ClientAuthBasic, oauth2.AuthStyleInParams, "form body", oauth2.AuthStyleInHeader},
		{ClientAuthPost, oauth2.AuthStyleInHeader, "HTTP Basic", oauth2.AuthStyleInParams},
	} {
		t.Run(tc.method, func(t *testing.T) {
			e := newEnv(t, Options{ClientAuth: tc.method})
			if e.cfg.Endpoint.AuthStyle != tc.configStyle {
				t.Fatalf("OAuth2Config auth style = %v, want %v", e.cfg.Endpoint.AuthStyle, tc.configStyle)
			}
			tok := e.grant(t)
			e.cfg.Endpoint.AuthStyle = tc.other
			_, err := e.refresh(tok.RefreshToken)
			if re := retrieveError(t, err, "invalid_client"); re.Response.StatusCode != http.StatusUnauthorized {
				t.Errorf("%s: status %d, want 401", tc.otherName, re.Response.StatusCode)
			}
			e.cfg.Endpoint.AuthStyle = tc.configStyle
			if _, err := e.refresh(tok.RefreshToken); err != nil {
				t.Fatalf("refresh with %s after the rejected %s: %v", tc.method, tc.otherName, err)
			}
			if s := e.p.Stats(); s.Refreshes != 1 || s.RefreshReuse != 0 {
				t.Errorf("stats = %+v", s)
			}
		})
	}
	if _, err := New(Options{ClientAuth: "private_key_jwt"}); err == nil {
		t.Error("New accepted an unsupported ClientAuth")
	}
}

func TestRefreshRotatesAndRevokes(t *testing.T) {
	e := newEnv(t, Options{})
	tok := e.grant(t)

	next, err := e.refresh(tok.RefreshToken)
	if err != nil {
		t.Fatalf("refresh: %v", err)
	}
	if next.RefreshToken == "" || next.RefreshToken == tok.RefreshToken {
		t.Fatal("refresh did not rotate the refresh token")
	}
	if next.AccessToken == tok.AccessToken {
		t.Fatal("refresh returned the same access token")
	}
	wantResource(t, e, tok.AccessToken, http.StatusUnauthorized) // revoked, not expired
	wantResource(t, e, next.AccessToken, http.StatusOK)

	// A second, sequential rotation works with the newest refresh token.
	third, err := e.refresh(next.RefreshToken)
	if err != nil {
		t.Fatalf("second refresh: %v", err)
	}
	wantResource(t, e, next.AccessToken, http.StatusUnauthorized)
	wantResource(t, e, third.AccessToken, http.StatusOK)

	// Reusing the first refresh token: invalid_grant, counted as reuse...
	_, err = e.refresh(tok.RefreshToken)
	re := retrieveError(t, err, "invalid_grant")
	if re.Response.StatusCode != http.StatusBadRequest {
		t.Errorf("reuse status = %d", re.Response.StatusCode)
	}
	s := e.p.Stats()
	if s.Refreshes != 2 || s.RefreshReuse != 1 || s.RefreshRejected != 1 {
		t.Errorf("stats = %+v", s)
	}

	// ...and, per RFC 9700 §4.14.2, the whole grant is revoked: the newest
	// tokens are dead too.
	wantResource(t, e, third.AccessToken, http.StatusUnauthorized)
	_, err = e.refresh(third.RefreshToken)
	retrieveError(t, err, "invalid_grant")
	// Still reuse when presented again after fosite deleted its session.
	_, err = e.refresh(tok.RefreshToken)
	retrieveError(t, err, "invalid_grant")
	s = e.p.Stats()
	if s.Refreshes != 2 || s.RefreshReuse != 2 || s.RefreshRejected != 3 {
		t.Errorf("stats = %+v", s)
	}

	// Other grants are unaffected.
	other := e.grant(t)
	wantResource(t, e, other.AccessToken, http.StatusOK)
	if _, err := e.refresh(other.RefreshToken); err != nil {
		t.Fatalf("refresh of an unrelated grant: %v", err)
	}
}

func TestConcurrentRefreshExactlyOneWins(t *testing.T) {
	// The latency case holds every request between fosite's validation and
	// its rotation, where only the rotation lock keeps them apart.
	for _, latency := range []time.Duration{0, 5 * time.Millisecond} {
		t.Run(latency.String(), func(t *testing.T) {
			testConcurrentRefresh(t, latency)
		})
	}
}

func testConcurrentRefresh(t *testing.T, latency time.Duration) {
	e := newEnv(t, Options{RefreshLatency: latency})
	tok := e.grant(t)

	const n = 20
	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		winners = make(chan *oauth2.Token, n)
		errs    = make(chan error, n)
	)
	for range n {
		wg.Go(func() {
			<-start
			nt, err := e.refresh(tok.RefreshToken)
			if err != nil {
				errs <- err
				return
			}
			winners <- nt
		})
	}
	close(start)
	wg.Wait()
	close(winners)
	close(errs)

	if len(winners) != 1 {
		t.Fatalf("%d refreshes succeeded, want exactly 1", len(winners))
	}
	for err := range errs {
		retrieveError(t, err, "invalid_grant")
	}
	s := e.p.Stats()
	if s.Refreshes != 1 || s.RefreshReuse != n-1 || s.RefreshRejected != n-1 {
		t.Errorf("stats = %+v", s)
	}
	// The losers' reuse revoked the winner's grant: the race is loud.
	w := <-winners
	wantResource(t, e, w.AccessToken, http.StatusUnauthorized)
	_, err := e.refresh(w.RefreshToken)
	retrieveError(t, err, "invalid_grant")
}

func TestRefreshLockDoesNotBlockOthers(t *testing.T) {
	const latency = 600 * time.Millisecond
	e := newEnv(t, Options{})
	tok := e.grant(t)
	e.p.SetRefreshLatency(latency)

	done := make(chan error, 1)
	go func() {
		_, err := e.refresh(tok.RefreshToken)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond) // let the refresh take the lock

	began := time.Now()
	other := e.grant(t)
	wantResource(t, e, other.AccessToken, http.StatusOK)
	wantResource(t, e, tok.AccessToken, http.StatusOK) // not yet rotated
	if d := time.Since(began); d > latency/2 {
		t.Errorf("code exchange and /resource took %v while a refresh was in progress", d)
	}
	if err := <-done; err != nil {
		t.Fatalf("slow refresh: %v", err)
	}
	if time.Since(began) < latency/2 {
		t.Error("RefreshLatency was not applied")
	}
	wantResource(t, e, tok.AccessToken, http.StatusUnauthorized)
}

func TestAccessTokenExpiry(t *testing.T) {
	e := newEnv(t, Options{AccessTokenLifespan: 300 * time.Millisecond})
	tok := e.grant(t)
	if got := tok.Extra("expires_in"); got != float64(1) {
		t.Errorf("expires_in = %v, want 1 (minimum)", got)
	}
	wantResource(t, e, tok.AccessToken, http.StatusOK)
	time.Sleep(400 * time.Millisecond)
	wantResource(t, e, tok.AccessToken, http.StatusUnauthorized)

	// Refreshed access tokens get the same precise lifespan.
	next, err := e.refresh(tok.RefreshToken)
	if err != nil {
		t.Fatal(err)
	}
	wantResource(t, e, next.AccessToken, http.StatusOK)
	time.Sleep(400 * time.Millisecond)
	wantResource(t, e, next.AccessToken, http.StatusUnauthorized)
}

func TestFaults(t *testing.T) {
	e := newEnv(t, Options{})
	tok := e.grant(t)

	check := func(t *testing.T, err error, status int, code string) *oauth2.RetrieveError {
		t.Helper()
		re := retrieveError(t, err, code)
		if re.Response.StatusCode != status {
			t.Errorf("status = %d, want %d", re.Response.StatusCode, status)
		}
		return re
	}
	tests := []struct {
		fault Fault
		check func(t *testing.T, err error)
	}{
		{FaultUnavailable, func(t *testing.T, err error) {
			check(t, err, http.StatusServiceUnavailable, "temporarily_unavailable")
		}},
		{FaultTooManyRequests, func(t *testing.T, err error) {
			re := check(t, err, http.StatusTooManyRequests, "temporarily_unavailable")
			if got := re.Response.Header.Get("Retry-After"); got != "1" {
				t.Errorf("Retry-After = %q", got)
			}
		}},
		{FaultInvalidGrant, func(t *testing.T, err error) {
			check(t, err, http.StatusBadRequest, "invalid_grant")
		}},
		{FaultInvalidClient, func(t *testing.T, err error) {
			check(t, err, http.StatusUnauthorized, "invalid_client")
		}},
		{FaultHang, func(t *testing.T, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("want client timeout, got %v", err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.fault.String(), func(t *testing.T) {
			e.p.ResetStats()
			var calls atomic.Int64
			e.p.SetRefreshFault(func() Fault { calls.Add(1); return tt.fault })
			ctx, cancel := context.WithTimeout(e.ctx, 200*time.Millisecond)
			defer cancel()
			_, err := e.refreshCtx(ctx, tok.RefreshToken)
			tt.check(t, err)
			if calls.Load() != 1 {
				t.Errorf("fault func called %d times", calls.Load())
			}
			s := e.p.Stats()
			if s.RefreshFaults != 1 || s.RefreshRejected != 1 || s.Refreshes != 0 || s.RefreshReuse != 0 {
				t.Errorf("stats = %+v", s)
			}

			// Nothing was rotated or revoked.
			e.p.SetRefreshFault(nil)
			wantResource(t, e, tok.AccessToken, http.StatusOK)
			next, err := e.refresh(tok.RefreshToken)
			if err != nil {
				t.Fatalf("refresh after %v: %v", tt.fault, err)
			}
			tok = next
		})
	}
}

func TestRevokeAll(t *testing.T) {
	e := newEnv(t, Options{})
	a := e.grant(t)
	b := e.grant(t)
	b2, err := e.refresh(b.RefreshToken)
	if err != nil {
		t.Fatal(err)
	}
	e.p.ResetStats()

	e.p.RevokeAll()
	for _, tok := range []*oauth2.Token{a, b2} {
		wantResource(t, e, tok.AccessToken, http.StatusUnauthorized)
		_, err := e.refresh(tok.RefreshToken)
		retrieveError(t, err, "invalid_grant")
	}
	if s := e.p.Stats(); s.RefreshReuse != 0 || s.RefreshRejected != 2 || s.Resource401 != 2 {
		t.Errorf("stats = %+v", s)
	}

	c := e.grant(t)
	wantResource(t, e, c.AccessToken, http.StatusOK)
	if _, err := e.refresh(c.RefreshToken); err != nil {
		t.Fatalf("refresh of a new grant after RevokeAll: %v", err)
	}
}

func TestResourceByAgent(t *testing.T) {
	e := newEnv(t, Options{})
	tok := e.grant(t)
	for _, ua := range []string{"tokenguard-server/1.2", "tokenguard-server/1.2 (linux)", "tokenguard-cli/0.1", "curl"} {
		if got := e.resource(t, tok.AccessToken, ua); got != http.StatusOK {
			t.Fatalf("resource with %q = %d", ua, got)
		}
	}
	e.resource(t, "invalid", "tokenguard-cli/0.1") // 401s are not counted by agent

	s := e.p.Stats()
	want := map[string]int64{"tokenguard-server": 2, "tokenguard-cli": 1, "curl": 1}
	if len(s.ResourceByAgent) != len(want) {
		t.Fatalf("ResourceByAgent = %v, want %v", s.ResourceByAgent, want)
	}
	for k, v := range want {
		if s.ResourceByAgent[k] != v {
			t.Errorf("ResourceByAgent[%q] = %d, want %d", k, s.ResourceByAgent[k], v)
		}
	}
	s.ResourceByAgent["tokenguard-server"] = 100
	if e.p.Stats().ResourceByAgent["tokenguard-server"] != 2 {
		t.Error("Stats().ResourceByAgent is not a copy")
	}

	// /stats serves the same numbers.
	resp, err := e.srv.Client().Get(e.srv.URL + "/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got Stats
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	if got.ResourceOK != 4 || got.Resource401 != 1 || got.CodeExchanges != 1 || got.ResourceByAgent["tokenguard-cli"] != 1 {
		t.Errorf("/stats = %+v", got)
	}

	e.p.ResetStats()
	if s := e.p.Stats(); s.ResourceOK != 0 || len(s.ResourceByAgent) != 0 {
		t.Errorf("after ResetStats: %+v", s)
	}
}

func TestRedirectURIs(t *testing.T) {
	t.Run("unregistered rejected", func(t *testing.T) {
		e := newEnv(t, Options{})
		e.cfg.RedirectURL = "http://127.0.0.1/elsewhere"
		if _, err := Grant(e.ctx, e.cfg); err == nil {
			t.Fatal("Grant with an unregistered redirect URI succeeded")
		}
		if s := e.p.Stats(); s.CodeExchanges != 0 {
			t.Errorf("stats = %+v", s)
		}
	})
	t.Run("loopback any port", func(t *testing.T) {
		e := newEnv(t, Options{})
		e.cfg.RedirectURL = "http://127.0.0.1:49152/callback"
		e.grant(t)
	})
	t.Run("wildcard", func(t *testing.T) {
		e := newEnv(t, Options{RedirectURIs: []string{"*"}})
		e.cfg.RedirectURL = "https://app.example/oauth/cb"
		e.grant(t)
	})
	t.Run("scope not allowed", func(t *testing.T) {
		e := newEnv(t, Options{})
		e.cfg.Scopes = []string{"admin"}
		if _, err := Grant(e.ctx, e.cfg); err == nil {
			t.Fatal("Grant with a disallowed scope succeeded")
		}
	})
	t.Run("offline scopes accepted", func(t *testing.T) {
		e := newEnv(t, Options{})
		e.cfg.Scopes = []string{"api", "offline_access"}
		e.grant(t)
	})
}

func TestCodeReuse(t *testing.T) {
	e := newEnv(t, Options{})

	// Keep refreshes of another grant running meanwhile: fosite revokes the
	// code's grant through the same refresh-token map (see store).
	rt := e.grant(t).RefreshToken
	stop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			nt, err := e.refresh(rt)
			if err != nil {
				t.Errorf("background refresh: %v", err)
				return
			}
			rt = nt.RefreshToken
		}
	})
	defer func() { close(stop); bg.Wait() }()

	for range 10 {
		code, err := authorize(e.ctx, e.cfg)
		if err != nil {
			t.Fatal(err)
		}
		tok, err := e.cfg.Exchange(e.ctx, code)
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.cfg.Exchange(e.ctx, code)
		retrieveError(t, err, "invalid_grant")
		// fosite revokes what the code issued once it sees the code again.
		wantResource(t, e, tok.AccessToken, http.StatusUnauthorized)
		_, err = e.refresh(tok.RefreshToken)
		retrieveError(t, err, "invalid_grant")
	}
}
