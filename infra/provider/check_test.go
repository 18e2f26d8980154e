package provider_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/internal/sandbox"
)

// These tests ask real endpoints: the sandbox provider (fosite) for the
// answers of a token endpoint, and plain servers for what a wrong URL
// answers.

func TestCheckTellsEachMisconfiguration(t *testing.T) {
	p, err := sandbox.New(sandbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// The sandbox behind a front that, like providers registered for
	// client_secret_post only, rejects HTTP Basic with a 401.
	paramsOnly := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, _, basic := r.BasicAuth(); basic {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":"invalid_client"}`))
			return
		}
		p.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(paramsOnly.Close)
	srv := httptest.NewServer(p.Handler())
	t.Cleanup(srv.Close)
	good := p.OAuth2Config(srv.URL)

	// A live grant: the check must never spend its refresh token.
	live, err := sandbox.Grant(context.Background(), good)
	if err != nil {
		t.Fatal(err)
	}
	p.ResetStats()

	html := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte("<!doctype html><html><body>Welcome to Acme</body></html>"))
	}))
	t.Cleanup(html.Close)
	getOnly := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", "GET")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		}
	}))
	t.Cleanup(getOnly.Close)
	redirect := httptest.NewServer(http.RedirectHandler(srv.URL+"/oauth2/token", http.StatusFound))
	t.Cleanup(redirect.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := "http://" + ln.Addr().String()
	ln.Close()

	with := func(tokenURL, secret string, style oauth2.AuthStyle) *oauth2.Config {
		c := *good
		c.Endpoint.TokenURL, c.Endpoint.AuthStyle = tokenURL, style
		if secret != "" {
			c.ClientSecret = secret
		}
		return &c
	}
	header, params, auto := oauth2.AuthStyleInHeader, oauth2.AuthStyleInParams, oauth2.AuthStyleAutoDetect
	for _, c := range []struct {
		name    string
		cfg     *oauth2.Config
		verdict provider.CheckVerdict
		styles  string
		says    string
	}{
		{"sandbox, header", with(srv.URL+"/oauth2/token", "", header), provider.CheckOK, "header", "invalid_grant (HTTP 400)"},
		{"sandbox, params", with(srv.URL+"/oauth2/token", "", params), provider.CheckOK, "params", "OAUTH_AUTH_STYLE=params"},
		{"sandbox, auto takes header first", with(srv.URL+"/oauth2/token", "", auto), provider.CheckOK, "header", "no refresh token was spent"},
		{"params-only provider, auto", with(paramsOnly.URL+"/oauth2/token", "", auto), provider.CheckOK, "header params", "OAUTH_AUTH_STYLE=params"},
		{"params-only provider, header", with(paramsOnly.URL+"/oauth2/token", "", header), provider.CheckClientRejected, "header", "invalid_client (HTTP 401)"},
		{"wrong secret", with(srv.URL+"/oauth2/token", "not-the-secret", header), provider.CheckClientRejected, "header", "check OAUTH_CLIENT_ID, OAUTH_CLIENT_SECRET"},
		{"wrong secret, auto", with(srv.URL+"/oauth2/token", "not-the-secret", auto), provider.CheckClientRejected, "header params", "OAUTH_AUTH_STYLE=header and to params"},
		{"URL answering HTML", with(html.URL+"/login", "", header), provider.CheckNotJSON, "header", "HTTP 200 with text/html, not JSON"},
		{"404", with(srv.URL+"/oauth2/tokens", "", header), provider.CheckNotTokenEndpoint, "header", "HTTP 404, not found"},
		{"405", with(getOnly.URL+"/token", "", header), provider.CheckNotTokenEndpoint, "header", "HTTP 405, POST not allowed"},
		{"redirect", with(redirect.URL+"/token", "", header), provider.CheckNotTokenEndpoint, "header", "HTTP 302, a redirect"},
		{"closed port", with(closedPort+"/token", "", header), provider.CheckUnreachable, "header", "connection refused"},
	} {
		t.Run(c.name, func(t *testing.T) {
			res := provider.Check(context.Background(), c.cfg, provider.NewHTTPClient(5*time.Second))
			t.Logf("%s", res)
			if res.Verdict != c.verdict || strings.Join(res.Styles, " ") != c.styles || !strings.Contains(res.String(), c.says) {
				t.Errorf("verdict %v, styles %v, %q; want %v, %q, saying %q", res.Verdict, res.Styles, res, c.verdict, c.styles, c.says)
			}
			if res.OK() != (c.verdict == provider.CheckOK) {
				t.Errorf("OK() = %t", res.OK())
			}
			if strings.Contains(res.String(), good.ClientSecret) || strings.Contains(res.String(), "not-the-secret") {
				t.Errorf("the result shows a secret: %q", res)
			}
		})
	}

	// The provider saw only rejected requests: no refresh, no reuse, and
	// the live grant's refresh token still works, once.
	st := p.Stats()
	if st.Refreshes != 0 || st.RefreshReuse != 0 || st.RefreshRejected == 0 {
		t.Errorf("provider stats after the checks: %+v; want 0 refreshes, 0 reuse, some rejected", st)
	}
	if _, err := good.TokenSource(context.Background(), &oauth2.Token{RefreshToken: live.RefreshToken}).Token(); err != nil {
		t.Errorf("the live grant after the checks: %v", err)
	}
	if st := p.Stats(); st.Refreshes != 1 || st.RefreshReuse != 0 {
		t.Errorf("refreshing the live grant: %+v", st)
	}
}

func TestCheckStopsWithItsContext(t *testing.T) {
	hang := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // only then does the server notice the client leave
		<-r.Context().Done()
	}))
	t.Cleanup(hang.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	cfg := &oauth2.Config{ClientID: "c", ClientSecret: "s", Endpoint: oauth2.Endpoint{TokenURL: hang.URL, AuthStyle: oauth2.AuthStyleInHeader}}
	if res := provider.Check(ctx, cfg, nil); res.Verdict != provider.CheckUnreachable {
		t.Errorf("hung endpoint: %v", res)
	}
}
