package provider

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
)

// Credentials the tests send. The odd characters check the RFC 6749
// §2.3.1 encoding; the secrets must never show in an error or a log line.
const (
	testClientID     = "client id:1"
	testClientSecret = "client-SECRET/+:%"
	testRefreshToken = "rt-SECRET-marker"
	leaked           = "rt-secret-echoed-by-provider"
)

// seen is one token request as the test server received it.
type seen struct {
	style        string // "header", "params", "both" or "none"
	refreshToken string
	grantType    string
}

// endpoint is a token endpoint run by httptest: answer decides each reply,
// and every request is recorded.
type endpoint struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []seen
}

// reply is one answer of an endpoint.
type reply struct {
	status      int
	contentType string
	header      http.Header
	body        string
}

func newEndpoint(t *testing.T, answer func(seen) reply) *endpoint {
	t.Helper()
	e := &endpoint{}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := r.ParseForm(); err != nil {
			w.WriteHeader(400)
			return
		}
		s := seen{refreshToken: r.PostForm.Get("refresh_token"), grantType: r.PostForm.Get("grant_type"), style: "none"}
		id, secret, basic := r.BasicAuth()
		form := r.PostForm.Has("client_id")
		switch {
		case basic && form:
			s.style = "both"
		case basic:
			// RFC 6749 §2.3.1: form-encoded, then Basic.
			uid, err1 := url.QueryUnescape(id)
			usecret, err2 := url.QueryUnescape(secret)
			if err1 != nil || err2 != nil || uid != testClientID || usecret != testClientSecret {
				s.style = "bad-basic"
			} else {
				s.style = StyleHeader
			}
		case form:
			if r.PostForm.Get("client_id") != testClientID || r.PostForm.Get("client_secret") != testClientSecret {
				s.style = "bad-params"
			} else {
				s.style = StyleParams
			}
		}
		e.mu.Lock()
		e.got = append(e.got, s)
		e.mu.Unlock()
		a := answer(s)
		for k, v := range a.header {
			w.Header()[k] = v
		}
		w.Header().Set("Content-Type", cmpOr(a.contentType, "application/json"))
		w.WriteHeader(a.status)
		_, _ = w.Write([]byte(a.body))
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func (e *endpoint) requests() []seen {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]seen(nil), e.got...)
}

func (e *endpoint) config(style oauth2.AuthStyle) *oauth2.Config {
	return &oauth2.Config{ClientID: testClientID, ClientSecret: testClientSecret,
		Endpoint: oauth2.Endpoint{TokenURL: e.srv.URL + "/token", AuthStyle: style}}
}

// fixed answers every request alike.
func fixed(r reply) func(seen) reply { return func(seen) reply { return r } }

// checkClean fails if s shows a credential the client sent.
func checkClean(t *testing.T, what, s string) {
	t.Helper()
	for _, secret := range []string{testRefreshToken, testClientSecret, url.QueryEscape(testClientSecret), leaked} {
		if strings.Contains(s, secret) {
			t.Errorf("%s shows a secret (%q): %s", what, secret, s)
		}
	}
}

func TestClassification(t *testing.T) {
	html := "text/html; charset=utf-8"
	cases := []struct {
		name  string
		reply reply
		class domain.ErrorClass
		code  string
	}{
		// GrantDead: the short list.
		{"invalid_grant", reply{400, "", nil, `{"error":"invalid_grant","error_description":"token ` + leaked + ` was reused"}`}, domain.GrantDead, "invalid_grant"},
		{"invalid_grant with 401", reply{401, "", nil, `{"error":"invalid_grant"}`}, domain.GrantDead, "invalid_grant"},
		{"invalid_grant in a form answer", reply{400, "application/x-www-form-urlencoded", nil, `error=invalid_grant&error_description=` + leaked}, domain.GrantDead, "invalid_grant"},
		{"Slack: 200 with ok false, invalid_refresh_token", reply{200, "", nil, `{"ok":false,"error":"invalid_refresh_token"}`}, domain.GrantDead, "invalid_refresh_token"},
		{"200 with invalid_grant", reply{200, "", nil, `{"error":"invalid_grant"}`}, domain.GrantDead, "invalid_grant"},
		{"HubSpot: 400 BAD_REFRESH_TOKEN", reply{400, "", nil, `{"status":"BAD_REFRESH_TOKEN","message":"missing or unknown refresh token ` + leaked + `"}`}, domain.GrantDead, "BAD_REFRESH_TOKEN"},

		// ClientRejected.
		{"invalid_client 401", reply{401, "", http.Header{"WWW-Authenticate": {`Basic realm="x"`}}, `{"error":"invalid_client"}`}, domain.ClientRejected, "invalid_client"},
		{"invalid_client 400", reply{400, "", nil, `{"error":"invalid_client"}`}, domain.ClientRejected, "invalid_client"},
		{"unauthorized_client", reply{400, "", nil, `{"error":"unauthorized_client"}`}, domain.ClientRejected, "unauthorized_client"},
		{"unsupported_grant_type", reply{400, "", nil, `{"error":"unsupported_grant_type"}`}, domain.ClientRejected, "unsupported_grant_type"},
		{"invalid_scope", reply{400, "", nil, `{"error":"invalid_scope"}`}, domain.ClientRejected, "invalid_scope"},
		// Ambiguous (client or grant): unclassified without evidence (evidence_test.go).
		{"invalid_request", reply{400, "", nil, `{"error":"invalid_request"}`}, domain.Unclassified, "invalid_request"},
		{"401 without a code", reply{401, "", nil, ``}, domain.ClientRejected, ""},
		{"401 with an HTML page", reply{401, html, nil, `<html>login ` + leaked + `</html>`}, domain.ClientRejected, ""},
		{"401 with an unknown code", reply{401, "", nil, `{"error":"` + leaked + `"}`}, domain.ClientRejected, "unrecognized_error"},
		{"200 with invalid_client", reply{200, "", nil, `{"ok":false,"error":"invalid_client"}`}, domain.ClientRejected, "invalid_client"},

		// EndpointMisconfigured.
		{"404 HTML", reply{404, html, nil, `<html>not found</html>`}, domain.EndpointMisconfigured, ""},
		{"404 with invalid_grant", reply{404, "", nil, `{"error":"invalid_grant"}`}, domain.EndpointMisconfigured, "invalid_grant"},
		{"405", reply{405, "", http.Header{"Allow": {"GET"}}, ``}, domain.EndpointMisconfigured, ""},
		{"301", reply{301, html, http.Header{"Location": {"https://elsewhere.example/token"}}, `moved`}, domain.EndpointMisconfigured, ""},
		{"302", reply{302, html, http.Header{"Location": {"/login?next=" + leaked}}, `found`}, domain.EndpointMisconfigured, ""},
		{"307", reply{307, "", http.Header{"Location": {"/token2"}}, ``}, domain.EndpointMisconfigured, ""},
		{"308", reply{308, "", http.Header{"Location": {"https://x.example/token"}}, ``}, domain.EndpointMisconfigured, ""},

		// Transient.
		{"500", reply{500, "", nil, `{"error":"server_error"}`}, domain.Transient, "server_error"},
		{"502 HTML", reply{502, html, nil, `<html>bad gateway ` + leaked + `</html>`}, domain.Transient, ""},
		{"503 temporarily_unavailable", reply{503, "", nil, `{"error":"temporarily_unavailable"}`}, domain.Transient, "temporarily_unavailable"},
		{"503 with invalid_grant", reply{503, "", nil, `{"error":"invalid_grant"}`}, domain.Transient, "invalid_grant"},
		{"429", reply{429, "", nil, `{"error":"slow_down"}`}, domain.Transient, "slow_down"},
		{"400 HTML", reply{400, html, nil, `<html>bad request</html>`}, domain.Unclassified, ""},
		{"400 without a code", reply{400, "", nil, `{}`}, domain.Unclassified, ""},
		{"400 with an unknown code", reply{400, "", nil, `{"error":"invalid_refresh"}`}, domain.Unclassified, "unrecognized_error"},
		{"400 with a code echoing the request", reply{400, "", nil, `{"error":"` + leaked + `"}`}, domain.Unclassified, "unrecognized_error"},
		{"400 temporarily_unavailable", reply{400, "", nil, `{"error":"temporarily_unavailable"}`}, domain.Transient, "temporarily_unavailable"},

		// Unclassified: an answer that says nothing to act on.
		{"HubSpot: 400 with another status", reply{400, "", nil, `{"status":"BAD_CLIENT_ID","message":"x"}`}, domain.Unclassified, ""},
		{"403 without a code", reply{403, html, nil, `<html>forbidden</html>`}, domain.Unclassified, ""},
		{"Slack: 200 with another error", reply{200, "", nil, `{"ok":false,"error":"invalid_client_id"}`}, domain.Unclassified, "unrecognized_error"},
		{"200 with ok false alone", reply{200, "", nil, `{"ok":false}`}, domain.Unclassified, ""},
		{"200 HTML", reply{200, html, nil, `<html>welcome ` + leaked + `</html>`}, domain.Unclassified, ""},
		{"200 without an access token", reply{200, "", nil, `{"token_type":"bearer","refresh_token":"` + leaked + `"}`}, domain.Unclassified, ""},
		{"200 truncated JSON", reply{200, "", nil, `{"access_token":"at","expi`}, domain.Unclassified, ""},
		{"200 empty", reply{200, "", nil, ``}, domain.Unclassified, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// Fixed styles: classification alone, one request each.
			for _, style := range []oauth2.AuthStyle{oauth2.AuthStyleInHeader, oauth2.AuthStyleInParams} {
				e := newEndpoint(t, fixed(c.reply))
				g, err := NewRefresher(e.config(style), nil).Refresh(context.Background(), domain.NewSecret(testRefreshToken))
				var pe *domain.ProviderError
				if !errors.As(err, &pe) {
					t.Fatalf("err = %T %v, want *domain.ProviderError", err, err)
				}
				if !reflect.DeepEqual(g, domain.Grant{}) {
					t.Errorf("an error came with a grant")
				}
				if pe.Class != c.class || pe.Code != c.code || pe.HTTPStatus != c.reply.status {
					t.Errorf("got class %v code %q status %d, want %v %q %d", pe.Class, pe.Code, pe.HTTPStatus, c.class, c.code, c.reply.status)
				}
				for _, sentinel := range []error{domain.ErrGrantRevoked, domain.ErrClientRejected, domain.ErrEndpointMisconfigured, domain.ErrProviderUnavailable} {
					if want := sentinel == c.class.Sentinel(); errors.Is(err, sentinel) != want {
						t.Errorf("errors.Is(err, %v) = %v, want %v", sentinel, !want, want)
					}
				}
				checkClean(t, "error", err.Error()+fmt.Sprintf(" %v %+v %#v", err, err, pe))
				if n := len(e.requests()); n != 1 {
					t.Errorf("%d requests, want 1", n)
				}
			}
		})
	}
}

func TestRetryAfter(t *testing.T) {
	e := newEndpoint(t, fixed(reply{429, "", http.Header{"Retry-After": {"7"}}, `{"error":"temporarily_unavailable"}`}))
	_, err := NewRefresher(e.config(oauth2.AuthStyleInHeader), nil).Refresh(context.Background(), domain.NewSecret(testRefreshToken))
	var pe *domain.ProviderError
	if !errors.As(err, &pe) || pe.RetryAfter != 7*time.Second {
		t.Errorf("err = %v, want Retry-After 7s", err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if got := RetryAfter(now.Add(90*time.Second).Format(http.TimeFormat), now); got != 90*time.Second {
		t.Errorf("date form = %v", got)
	}
	if got := RetryAfter("soon", now); got != 0 {
		t.Errorf("garbage = %v", got)
	}
}

func TestRefreshAnswers(t *testing.T) {
	const day = 24 * time.Hour
	cases := []struct {
		name            string
		reply           reply
		defaultLifetime time.Duration
		lifetime        time.Duration // 0: no expiry
		refreshLifetime time.Duration // 0: unknown
		refreshToken    string        // "": the provider did not rotate
		tokenType       string
	}{
		{"numeric expires_in", reply{200, "", nil, `{"access_token":"at","token_type":"bearer","refresh_token":"rt2","expires_in":3600}`}, 0, time.Hour, 0, "rt2", "Bearer"},
		{"string expires_in (Entra)", reply{200, "", nil, `{"access_token":"at","token_type":"Bearer","expires_in":"3600"}`}, 0, time.Hour, 0, "", "Bearer"},
		{"fractional expires_in", reply{200, "", nil, `{"access_token":"at","expires_in":3599.5}`}, 0, 3599500 * time.Millisecond, 0, "", "Bearer"},
		{"missing expires_in (Salesforce)", reply{200, "", nil, `{"access_token":"at","issued_at":"1700000000000"}`}, 0, 0, 0, "", "Bearer"},
		{"missing expires_in with a default lifetime", reply{200, "", nil, `{"access_token":"at"}`}, 20 * time.Minute, 20 * time.Minute, 0, "", "Bearer"},
		{"default lifetime does not override expires_in", reply{200, "", nil, `{"access_token":"at","expires_in":60}`}, 20 * time.Minute, time.Minute, 0, "", "Bearer"},
		{"unusable expires_in", reply{200, "", nil, `{"access_token":"at","expires_in":"soon"}`}, 0, 0, 0, "", "Bearer"},
		{"zero expires_in", reply{200, "", nil, `{"access_token":"at","expires_in":0}`}, 0, 0, 0, "", "Bearer"},
		{"negative expires_in", reply{200, "", nil, `{"access_token":"at","expires_in":-5}`}, 0, 0, 0, "", "Bearer"},
		{"absurd expires_in", reply{200, "", nil, `{"access_token":"at","expires_in":1e300}`}, 0, 0, 0, "", "Bearer"},
		{"refresh_token_expires_in", reply{200, "", nil, `{"access_token":"at","refresh_token":"rt2","expires_in":3600,"refresh_token_expires_in":7776000}`}, 0, time.Hour, 90 * day, "rt2", "Bearer"},
		{"x_refresh_token_expires_in (QuickBooks)", reply{200, "", nil, `{"access_token":"at","refresh_token":"rt2","expires_in":3600,"x_refresh_token_expires_in":"8726400"}`}, 0, time.Hour, 101 * day, "rt2", "Bearer"},
		{"no refresh_token (Google, Dropbox)", reply{200, "", nil, `{"access_token":"at","expires_in":3600,"token_type":"Bearer"}`}, 0, time.Hour, 0, "", "Bearer"},
		{"Slack success", reply{200, "", nil, `{"ok":true,"access_token":"at","token_type":"bot","refresh_token":"rt2","expires_in":43200}`}, 0, 12 * time.Hour, 0, "rt2", "bot"},
		{"form answer (GitHub legacy)", reply{200, "application/x-www-form-urlencoded", nil, `access_token=at&token_type=bearer&expires_in=28800&refresh_token=rt2&refresh_token_expires_in=15811200`}, 0, 8 * time.Hour, 183 * day, "rt2", "Bearer"},
		{"JSON as text/plain", reply{200, "text/plain", nil, `{"access_token":"at","expires_in":60}`}, 0, time.Minute, 0, "", "Bearer"},
		{"201", reply{201, "", nil, `{"access_token":"at","expires_in":60}`}, 0, time.Minute, 0, "", "Bearer"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEndpoint(t, fixed(c.reply))
			r := NewRefresher(e.config(oauth2.AuthStyleInHeader), nil, WithDefaultLifetime(c.defaultLifetime))
			before := time.Now()
			g, err := r.Refresh(context.Background(), domain.NewSecret(testRefreshToken))
			after := time.Now()
			if err != nil {
				t.Fatal(err)
			}
			if g.AccessToken.Reveal() != "at" || g.RefreshToken.Reveal() != c.refreshToken || g.TokenType != c.tokenType {
				t.Errorf("grant = %q %q %q", g.AccessToken.Reveal(), g.RefreshToken.Reveal(), g.TokenType)
			}
			within := func(what string, got time.Time, d time.Duration) {
				if d == 0 {
					if !got.IsZero() {
						t.Errorf("%s = %v, want none", what, got)
					}
					return
				}
				if got.Before(before.Add(d)) || got.After(after.Add(d)) {
					t.Errorf("%s = %v, want %v after the request", what, got.Sub(before), d)
				}
			}
			within("expiry", g.Expiry, c.lifetime)
			within("refresh expiry", g.RefreshExpiry, c.refreshLifetime)
		})
	}
}

// A refresh answer's scope is read as it is named; an answer without one
// (or a null) names none: RFC 6749 §5.1, the scope is unchanged.
func TestRefreshAnswerScope(t *testing.T) {
	for _, c := range []struct {
		name, ctype, body string
		scope             string
		named             bool
	}{
		{"named", "", `{"access_token":"at","scope":"api read"}`, "api read", true},
		{"named empty", "", `{"access_token":"at","scope":""}`, "", true},
		{"none", "", `{"access_token":"at"}`, "", false},
		{"null", "", `{"access_token":"at","scope":null}`, "", false},
		{"form (GitHub legacy)", "application/x-www-form-urlencoded", `access_token=at&scope=repo%2Cuser`, "repo,user", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEndpoint(t, fixed(reply{200, c.ctype, nil, c.body}))
			g, err := NewRefresher(e.config(oauth2.AuthStyleInHeader), nil).Refresh(context.Background(), domain.NewSecret(testRefreshToken))
			if err != nil || g.Scope != c.scope || g.ScopeNamed != c.named {
				t.Errorf("scope %q named %t, %v; want %q %t", g.Scope, g.ScopeNamed, err, c.scope, c.named)
			}
		})
	}
}

// A refresh answer without refresh_token keeps the stored one, with its
// known expiry; a rotated one without a named expiry has an unknown one.
func TestRefreshAnswerWithoutRefreshTokenKeepsTheStoredOne(t *testing.T) {
	now := time.Now()
	stored := domain.Token{Connection: "acme", AccessToken: domain.NewSecret("at0"), RefreshToken: domain.NewSecret(testRefreshToken),
		RefreshExpiry: now.Add(24 * time.Hour), Status: domain.StatusActive}
	for _, c := range []struct {
		body     string
		rt       string
		keepsExp bool
	}{
		{`{"access_token":"at","expires_in":60}`, testRefreshToken, true},
		{`{"access_token":"at","expires_in":60,"refresh_token":"rt2"}`, "rt2", false},
	} {
		e := newEndpoint(t, fixed(reply{200, "", nil, c.body}))
		g, err := NewRefresher(e.config(oauth2.AuthStyleInHeader), nil).Refresh(context.Background(), stored.RefreshToken)
		if err != nil {
			t.Fatal(err)
		}
		next := stored.Rotated(g, now)
		if next.RefreshToken.Reveal() != c.rt || next.RefreshExpiry.Equal(stored.RefreshExpiry) != c.keepsExp || (!c.keepsExp && !next.RefreshExpiry.IsZero()) {
			t.Errorf("%s: refresh token %q, refresh expiry %v", c.body, next.RefreshToken.Reveal(), next.RefreshExpiry)
		}
	}
}

func TestRequestShape(t *testing.T) {
	ok := fixed(reply{200, "", nil, `{"access_token":"at"}`})
	for _, c := range []struct {
		style oauth2.AuthStyle
		want  string
	}{{oauth2.AuthStyleInHeader, StyleHeader}, {oauth2.AuthStyleInParams, StyleParams}, {oauth2.AuthStyleAutoDetect, StyleHeader}} {
		e := newEndpoint(t, ok)
		if _, err := NewRefresher(e.config(c.style), nil).Refresh(context.Background(), domain.NewSecret(testRefreshToken)); err != nil {
			t.Fatal(err)
		}
		got := e.requests()
		if len(got) != 1 || got[0] != (seen{style: c.want, refreshToken: testRefreshToken, grantType: "refresh_token"}) {
			t.Errorf("style %v: requests %+v", c.style, got)
		}
	}
}

func TestTransportFailuresAreTransient(t *testing.T) {
	// Nothing listens on a closed server's address.
	srv := httptest.NewServer(http.NotFoundHandler())
	srv.Close()
	cfg := &oauth2.Config{ClientID: testClientID, ClientSecret: testClientSecret, Endpoint: oauth2.Endpoint{TokenURL: srv.URL}}
	_, err := NewRefresher(cfg, nil).Refresh(context.Background(), domain.NewSecret(testRefreshToken))
	if !errors.Is(err, domain.ErrProviderUnavailable) {
		t.Errorf("connection refused: err = %v", err)
	}
	checkClean(t, "error", fmt.Sprint(err))

	release := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(hang.Close)
	t.Cleanup(func() { close(release) })
	cfg.Endpoint.TokenURL = hang.URL
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = NewRefresher(cfg, nil).Refresh(ctx, domain.NewSecret(testRefreshToken))
	if !errors.Is(err, domain.ErrProviderUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("slow provider: err = %v, want ErrProviderUnavailable and DeadlineExceeded", err)
	}
	checkClean(t, "error", fmt.Sprint(err))
}

// A client that follows redirects is made not to: the credentials never
// go to another URL.
func TestRedirectIsNeverFollowed(t *testing.T) {
	target := newEndpoint(t, fixed(reply{200, "", nil, `{"access_token":"at"}`}))
	e := newEndpoint(t, fixed(reply{307, "", http.Header{"Location": {target.srv.URL + "/token"}}, ``}))
	_, err := NewRefresher(e.config(oauth2.AuthStyleInHeader), &http.Client{}).Refresh(context.Background(), domain.NewSecret(testRefreshToken))
	if !errors.Is(err, domain.ErrEndpointMisconfigured) {
		t.Errorf("err = %v, want ErrEndpointMisconfigured", err)
	}
	if n := len(target.requests()); n != 0 {
		t.Errorf("the redirect was followed: %d requests at its target", n)
	}
}

// The authorization-code exchange goes through x/oauth2; its answer's
// refresh token lifetime is kept as well.
func TestGrantFromReadsTheRefreshTokenLifetime(t *testing.T) {
	for _, extra := range []map[string]any{
		{"refresh_token_expires_in": float64(3600)},
		{"x_refresh_token_expires_in": "3600"},
	} {
		tok := (&oauth2.Token{AccessToken: "at", RefreshToken: "rt", TokenType: "bearer"}).WithExtra(extra)
		before := time.Now()
		g := GrantFrom(tok)
		if g.RefreshExpiry.Before(before.Add(time.Hour)) || g.RefreshExpiry.After(time.Now().Add(time.Hour)) || g.TokenType != "Bearer" {
			t.Errorf("%v: grant %+v", extra, g)
		}
	}
	if g := GrantFrom(&oauth2.Token{AccessToken: "at", RefreshToken: "rt"}); !g.RefreshExpiry.IsZero() {
		t.Errorf("no lifetime named: %v", g.RefreshExpiry)
	}
}

// Expiries are computed on the clock the processes decide staleness with
// (the database server's), not the host's.
func TestExpiryIsComputedOnTheGivenClock(t *testing.T) {
	server := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	e := newEndpoint(t, fixed(reply{200, "", nil, `{"access_token":"at","expires_in":60,"refresh_token_expires_in":3600}`}))
	g, err := NewRefresher(e.config(oauth2.AuthStyleInHeader), nil, WithClock(func() time.Time { return server })).
		Refresh(context.Background(), domain.NewSecret(testRefreshToken))
	if err != nil {
		t.Fatal(err)
	}
	if !g.Expiry.Equal(server.Add(time.Minute)) || !g.RefreshExpiry.Equal(server.Add(time.Hour)) {
		t.Errorf("expiry %v, refresh expiry %v; want them counted from %v", g.Expiry, g.RefreshExpiry, server)
	}
}
