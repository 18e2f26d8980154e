package conformance_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/zitadel/oidc/v3/example/server/exampleop"
	"github.com/zitadel/oidc/v3/example/server/storage"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/tools/internal/conformance"
)

// lifetime is the access-token lifetime every server grants (expires_in 2).
const lifetime = 2 * time.Second

const (
	clientSecret = "conformance-secret"
	redirectURI  = "http://127.0.0.1/callback"
)

// server is one authorization server under test, as the scenarios see it.
type server struct {
	name    string // the matrix row
	style   string // OAUTH_AUTH_STYLE that matches the client's registration
	basicOK bool   // the token endpoint accepts HTTP Basic client authentication
	oauth   *oauth2.Config
	api     string // base URL of the protected API; conformance.Path is the resource
	// revokesOnRefresh: the server revokes the previous access token when
	// it rotates (documented behaviour; the 401 scenario checks it).
	grant  func(ctx context.Context) (*oauth2.Token, error)
	revoke func(ctx context.Context, refreshToken string) error
	// ownReuse is the server's own count of refresh-token reuse (its
	// statistics or its log), and ownSource says where it comes from.
	ownReuse     func() int
	ownSource    string
	controlReuse int // the part of ownReuse the control scenario caused
	proxy        *conformance.Proxy
	proxyURL     string // tokenguard's OAUTH_TOKEN_URL
	// deadCode is the code a dead or reused refresh token is answered
	// with ("": invalid_grant); reuseWindow how long a rotated one is
	// answered again without rotating; startupCheck: the stacks run the
	// apps' start-up check and keep its answer as evidence (what tells a
	// dead grant from the code alone cannot).
	deadCode     string
	reuseWindow  time.Duration
	startupCheck bool
}

// withProxy puts the counting proxy in front of s.oauth's token endpoint.
func (s *server) withProxy(t *testing.T) *server {
	s.proxy = conformance.NewProxy(s.oauth.Endpoint.TokenURL)
	srv := httptest.NewServer(s.proxy)
	t.Cleanup(srv.Close)
	s.proxyURL = srv.URL + "/token"
	return s
}

// fositeServer is the sandbox (ory/fosite) restricted to one client
// authentication method.
func fositeServer(t *testing.T, method string) *server {
	return fositeClient(t, method, "", clientSecret)
}

// fositeClient is fositeServer with the given client id ("" is the
// sandbox's default) and secret.
func fositeClient(t *testing.T, method, clientID, secret string) *server {
	p, err := sandbox.New(sandbox.Options{ClientID: clientID, ClientSecret: secret, AccessTokenLifespan: lifetime, ClientAuth: method})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p.Handler())
	t.Cleanup(srv.Close)
	cfg := p.OAuth2Config(srv.URL)
	style := "header"
	if method == sandbox.ClientAuthPost {
		style = "params"
	}
	s := &server{
		style: style, basicOK: method == sandbox.ClientAuthBasic, oauth: cfg, api: srv.URL,
		grant: func(ctx context.Context) (*oauth2.Token, error) { return sandbox.Grant(ctx, cfg) },
		revoke: func(context.Context, string) error {
			p.RevokeAll()
			return nil
		},
		ownReuse:  func() int { return int(p.Stats().RefreshReuse) },
		ownSource: "sandbox statistics",
	}
	return s.withProxy(t)
}

// dexServer is the sandbox in Dex's shape (sandbox.Dex, bin/sandbox
// --dex): a dead, revoked or reused refresh token is answered 400
// invalid_request, a rotated one presented again within 3 s is answered
// again. The stacks have no profile: the start-up check's evidence
// decides what invalid_request means.
func dexServer(t *testing.T) *server {
	p, err := sandbox.New(sandbox.Dex(sandbox.Options{ClientSecret: clientSecret, AccessTokenLifespan: lifetime}))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p.Handler())
	t.Cleanup(srv.Close)
	cfg := p.OAuth2Config(srv.URL)
	s := &server{
		style: "header", basicOK: true, oauth: cfg, api: srv.URL,
		grant: func(ctx context.Context) (*oauth2.Token, error) { return sandbox.Grant(ctx, cfg) },
		revoke: func(context.Context, string) error {
			p.RevokeAll()
			return nil
		},
		ownReuse:  func() int { return int(p.Stats().RefreshReuse) },
		ownSource: "sandbox statistics",
		deadCode:  sandbox.DexDeadGrant.Code, reuseWindow: sandbox.DexReuseInterval, startupCheck: true,
	}
	return s.withProxy(t)
}

// zitadelStorage is the example storage of github.com/zitadel/oidc/v3
// (strict rotation: a refresh deletes the presented refresh token and the
// access token issued with it), with the access-token lifetime shortened
// from its fixed 5 minutes to lifetime, and reuse counted.
type zitadelStorage struct {
	*storage.Storage

	mu      sync.Mutex
	expiry  map[string]time.Time // access token id -> the expiry announced
	rotated map[string]bool      // refresh tokens rotated away
	reuse   atomic.Int64
}

func (s *zitadelStorage) CreateAccessAndRefreshTokens(ctx context.Context, req op.TokenRequest, current string) (string, string, time.Time, error) {
	id, rt, _, err := s.Storage.CreateAccessAndRefreshTokens(ctx, req, current)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if current != "" && s.rotated[current] {
			// Two requests presented the same token at once; the second
			// lost in renewRefreshToken.
			s.reuse.Add(1)
		}
		return "", "", time.Time{}, err
	}
	if current != "" {
		s.rotated[current] = true
	}
	// The OP truncates expires_in to whole seconds: half a second more
	// makes it announce exactly lifetime.
	exp := time.Now().Add(lifetime + 500*time.Millisecond)
	s.expiry[id] = exp
	return id, rt, exp, nil
}

func (s *zitadelStorage) TokenRequestByRefreshToken(ctx context.Context, rt string) (op.RefreshTokenRequest, error) {
	s.mu.Lock()
	if s.rotated[rt] {
		s.reuse.Add(1)
	}
	s.mu.Unlock()
	return s.Storage.TokenRequestByRefreshToken(ctx, rt)
}

func (s *zitadelStorage) SetIntrospectionFromToken(ctx context.Context, in *oidc.IntrospectionResponse, tokenID, subject, clientID string) error {
	s.mu.Lock()
	exp, ok := s.expiry[tokenID]
	s.mu.Unlock()
	if ok && time.Now().After(exp) {
		return errors.New("token is expired")
	}
	return s.Storage.SetIntrospectionFromToken(ctx, in, tokenID, subject, clientID)
}

// zitadelServer runs the example OpenID Provider of zitadel/oidc v3 in
// process, with its login page, and one web client that authenticates with
// HTTP Basic (the OP also accepts the form body).
func zitadelServer(t *testing.T) *server {
	var (
		handler http.Handler
		ready   = make(chan struct{})
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-ready
		handler.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	issuer := srv.URL
	const clientID = "tokenguard"
	st := &zitadelStorage{
		Storage: storage.NewStorageWithClients(storage.NewUserStore(issuer),
			map[string]*storage.Client{clientID: storage.WebClient(clientID, clientSecret, redirectURI)}),
		expiry:  map[string]time.Time{},
		rotated: map[string]bool{},
	}
	handler = exampleop.SetupServer(issuer, st, nil, false)
	close(ready)

	d := discover(t, issuer)
	cfg := &oauth2.Config{
		ClientID: clientID, ClientSecret: clientSecret, RedirectURL: redirectURI,
		Scopes:   []string{"openid", "offline_access"},
		Endpoint: oauth2.Endpoint{AuthURL: d.Authorization, TokenURL: d.Token, AuthStyle: oauth2.AuthStyleInHeader},
	}
	api := httptest.NewServer(&conformance.Resource{IntrospectionURL: d.Introspection, ClientID: clientID, Secret: clientSecret})
	t.Cleanup(api.Close)
	user := "test-user@" + strings.Split(strings.TrimPrefix(issuer, "http://"), ":")[0]
	s := &server{
		style: "header", basicOK: true, oauth: cfg, api: api.URL,
		grant: func(ctx context.Context) (*oauth2.Token, error) {
			return browserGrant(ctx, cfg, func(page string, form url.Values) bool {
				id := form.Get("id")
				if id == "" {
					return false
				}
				form.Set("username", user)
				form.Set("password", "verysecure")
				return true
			})
		},
		revoke: func(ctx context.Context, rt string) error {
			return revokeToken(ctx, d.Revocation, cfg, rt)
		},
		ownReuse: func() int { return int(st.reuse.Load()) },
		// The example OP logs no reuse; the storage wrapper counts it.
		ownSource: "its storage, wrapped by the test: the example OP logs no reuse",
	}
	return s.withProxy(t)
}

// discovery is the part of /.well-known/openid-configuration we use.
type discovery struct {
	Authorization string `json:"authorization_endpoint"`
	Token         string `json:"token_endpoint"`
	Introspection string `json:"introspection_endpoint"`
	Revocation    string `json:"revocation_endpoint"`
}

func discover(t *testing.T, issuer string) discovery {
	t.Helper()
	resp, err := http.Get(issuer + "/.well-known/openid-configuration")
	if err != nil {
		t.Fatalf("discovery: %v", err)
	}
	defer resp.Body.Close()
	var d discovery
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil || d.Token == "" || d.Introspection == "" || d.Revocation == "" {
		t.Fatalf("discovery of %s: %v %+v", issuer, err, d)
	}
	return d
}

// revokeToken revokes a refresh token (RFC 7009) with the client's
// credentials in its registered style; both servers then revoke the grant.
func revokeToken(ctx context.Context, endpoint string, cfg *oauth2.Config, rt string) error {
	form := url.Values{"token": {rt}, "token_type_hint": {"refresh_token"}}
	if cfg.Endpoint.AuthStyle == oauth2.AuthStyleInParams {
		form.Set("client_id", cfg.ClientID)
		form.Set("client_secret", cfg.ClientSecret)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(form.Encode()))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if cfg.Endpoint.AuthStyle != oauth2.AuthStyleInParams {
		req.SetBasicAuth(url.QueryEscape(cfg.ClientID), url.QueryEscape(cfg.ClientSecret))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("revocation answered %d: %s", resp.StatusCode, body)
	}
	return nil
}

var formAction = regexp.MustCompile(`(?is)<form[^>]*action="([^"]*)"`)
var hiddenInput = regexp.MustCompile(`(?is)<input[^>]*type="hidden"[^>]*name="([^"]+)"[^>]*value="([^"]*)"`)

// browserGrant runs the authorization-code flow the way a browser does,
// with a cookie jar: it follows the server's redirects through its login
// (and consent) pages, submitting each page's form with its hidden fields
// plus what fill adds (fill returns false for a page it does not know), until
// the server redirects to the client's redirect URI with a code, which it
// exchanges (with PKCE, which oidc-provider requires).
func browserGrant(ctx context.Context, cfg *oauth2.Config, fill func(page string, form url.Values) bool) (*oauth2.Token, error) {
	state, verifier := "conformance-state", oauth2.GenerateVerifier()
	q, err := browserCallback(ctx, cfg.AuthCodeURL(state, oauth2.SetAuthURLParam("prompt", "consent"), oauth2.S256ChallengeOption(verifier)),
		cfg.RedirectURL, fill)
	if err != nil {
		return nil, err
	}
	if q.Get("state") != state || q.Get("code") == "" {
		return nil, errors.New("authorization redirect without code or with a wrong state")
	}
	return cfg.Exchange(ctx, q.Get("code"), oauth2.VerifierOption(verifier))
}

// browserCallback drives the authorization pages from authURL as
// browserGrant does and returns the query of the redirect to redirectURL.
func browserCallback(ctx context.Context, authURL, redirectURL string, fill func(page string, form url.Values) bool) (url.Values, error) {
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar, Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	next, _ := http.NewRequestWithContext(ctx, http.MethodGet, authURL, nil)
	for step := 0; step < 12; step++ {
		resp, err := client.Do(next)
		if err != nil {
			return nil, fmt.Errorf("authorization step %d: %w", step, err)
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 256<<10))
		resp.Body.Close()
		switch {
		case resp.StatusCode >= 300 && resp.StatusCode < 400:
			loc, err := resp.Request.URL.Parse(resp.Header.Get("Location"))
			if err != nil {
				return nil, fmt.Errorf("authorization step %d: bad redirect", step)
			}
			if strings.HasPrefix(loc.String(), redirectURL) {
				q := loc.Query()
				if e := q.Get("error"); e != "" {
					return nil, fmt.Errorf("authorization failed: %s: %s", e, q.Get("error_description"))
				}
				return q, nil
			}
			next, _ = http.NewRequestWithContext(ctx, http.MethodGet, loc.String(), nil)
		case resp.StatusCode == http.StatusOK:
			form := url.Values{}
			for _, m := range hiddenInput.FindAllStringSubmatch(string(body), -1) {
				form.Set(m[1], m[2])
			}
			if !fill(string(body), form) {
				return nil, fmt.Errorf("authorization step %d: unknown page at %s", step, resp.Request.URL.Path)
			}
			action := resp.Request.URL
			if m := formAction.FindStringSubmatch(string(body)); m != nil && m[1] != "" {
				if action, err = resp.Request.URL.Parse(m[1]); err != nil {
					return nil, err
				}
			}
			next, _ = http.NewRequestWithContext(ctx, http.MethodPost, action.String(), strings.NewReader(form.Encode()))
			next.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		default:
			return nil, fmt.Errorf("authorization step %d: %s answered %d", step, resp.Request.URL.Path, resp.StatusCode)
		}
	}
	return nil, errors.New("authorization did not end in a redirect with a code")
}

// nodeServer is panva's oidc-provider from npm, run by node as a separate
// process (oidcprovider/server.mjs). Its dependencies are installed by the
// build (make conformance-deps, which make test runs); the test never
// downloads anything.
type nodeServer struct {
	issuer string
	mu     sync.Mutex
	events []map[string]any
	stderr strings.Builder
}

func startOIDCProvider(t *testing.T) *nodeServer { return startNodeServer(t, "oidcprovider") }

// startNodeServer runs sub/server.mjs (oidcprovider, oidcdpop) with the
// extra environment variables extra.
func startNodeServer(t *testing.T, sub string, extra ...string) *nodeServer {
	t.Helper()
	dir, err := filepath.Abs(sub)
	if err != nil {
		t.Fatal(err)
	}
	// Outside CI a fresh clone skips this cell, saying how to get it; CI
	// fails without it.
	missing := t.Fatalf
	if os.Getenv("CI") == "" {
		missing = func(format string, a ...any) { t.Skipf("skipped: "+format, a...) }
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "oidc-provider")); err != nil {
		missing("the oidc-provider cell needs its npm packages: run `make conformance-deps` (npm ci in %s); tests never download", dir)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("the oidc-provider cell needs node (>= 20): %v", err)
	}
	cmd := exec.Command(node, "server.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CLIENT_SECRET="+clientSecret, "REDIRECT_URI="+redirectURI,
		fmt.Sprintf("ACCESS_TOKEN_TTL=%d", int(lifetime/time.Second)), "NODE_ENV=test")
	cmd.Env = append(cmd.Env, extra...)
	n := &nodeServer{}
	cmd.Stderr = &lockedWriter{mu: &n.mu, w: &n.stderr}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start oidc-provider: %v", err)
	}
	exited := make(chan struct{})
	listening := make(chan string, 1)
	go func() {
		defer close(exited)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var ev map[string]any
			if json.Unmarshal(sc.Bytes(), &ev) != nil {
				continue
			}
			if u, ok := ev["listening"].(string); ok {
				listening <- u
			}
			n.mu.Lock()
			n.events = append(n.events, ev)
			n.mu.Unlock()
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	select {
	case n.issuer = <-listening:
	case <-exited:
		t.Fatalf("oidc-provider exited before listening; stderr:\n%s", n.stderrText())
	case <-time.After(20 * time.Second):
		t.Fatalf("oidc-provider did not listen within 20s; stderr:\n%s", n.stderrText())
	}
	return n
}

func (n *nodeServer) stderrText() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.stderr.String()
}

// count returns how many logged events match.
func (n *nodeServer) count(match func(map[string]any) bool) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := 0
	for _, ev := range n.events {
		if match(ev) {
			c++
		}
	}
	return c
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}

// oidcProviderServer is the separate oidc-provider process with rotation on
// every refresh. Its client is registered for client_secret_post, but the
// server accepts HTTP Basic too.
func oidcProviderServer(t *testing.T) *server {
	n := startOIDCProvider(t)
	d := discover(t, n.issuer)
	cfg := &oauth2.Config{
		ClientID: "tokenguard", ClientSecret: clientSecret, RedirectURL: redirectURI,
		Scopes:   []string{"openid", "offline_access"},
		Endpoint: oauth2.Endpoint{AuthURL: d.Authorization, TokenURL: d.Token, AuthStyle: oauth2.AuthStyleInParams},
	}
	api := httptest.NewServer(&conformance.Resource{IntrospectionURL: d.Introspection, ClientID: "resource-server", Secret: clientSecret})
	t.Cleanup(api.Close)
	s := &server{
		style: "params", basicOK: true, oauth: cfg, api: api.URL,
		grant: func(ctx context.Context) (*oauth2.Token, error) {
			// devInteractions: a login page (any login, any password),
			// then a consent page.
			return browserGrant(ctx, cfg, func(page string, form url.Values) bool {
				switch form.Get("prompt") {
				case "login":
					form.Set("login", "conformance-user")
					form.Set("password", "any")
					return true
				case "consent":
					return true
				}
				return false
			})
		},
		revoke: func(ctx context.Context, rt string) error { return revokeToken(ctx, d.Revocation, cfg, rt) },
		ownReuse: func() int {
			return n.count(func(ev map[string]any) bool { return ev["reuse"] == true })
		},
		ownSource: "its log: grant.error 'refresh token already used'",
	}
	return s.withProxy(t)
}
