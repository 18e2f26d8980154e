package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/oauth2"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/tokenguard/tokenguard"
	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/httpapi"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

const apiKey = "tgk_test"

type oneKey struct{}

func (oneKey) Verify(_ context.Context, s domain.Secret) (domain.KeyAccess, error) {
	if s.Reveal() == apiKey {
		return domain.KeyAccess{ID: 1, Name: "test"}, nil
	}
	return domain.KeyAccess{}, domain.ErrUnauthorized
}

// rig is the server on a real *tokenguard.Tokens (Postgres, Run running)
// with the connection acme granted at the strict sandbox, whose API sits
// behind upstream: /resource is the sandbox's (it checks the token),
// the rest are test endpoints.
type rig struct {
	t        testing.TB
	dbURL    string
	sb       *sandbox.Provider
	server   *httptest.Server // tokenguard
	upstream *httptest.Server
	deny     atomic.Int32 // the next n /resource calls are answered 401
	flaky    atomic.Int32 // the next n /flaky calls are answered 429 Retry-After: 0
	seen     chan *http.Request
	bodies   chan []byte
	release  chan struct{} // lets /stream finish

	upstreamConns atomic.Int64 // connections the upstream accepted
}

func newRig(t testing.TB, lifetime time.Duration) *rig {
	t.Helper()
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	r := &rig{t: t, seen: make(chan *http.Request, 64), bodies: make(chan []byte, 64), release: make(chan struct{})}
	var err error
	r.sb, err = sandbox.New(sandbox.Options{AccessTokenLifespan: lifetime})
	if err != nil {
		t.Fatal(err)
	}
	sb := r.sb.Handler()
	r.upstream = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		switch {
		case strings.HasPrefix(req.URL.Path, "/oauth2/"):
			sb.ServeHTTP(w, req)
		case req.URL.Path == "/resource":
			if r.deny.Add(-1) >= 0 {
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			sb.ServeHTTP(w, req)
		case req.URL.Path == "/fast": // the benchmarks' upstream
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"ok":true}`))
		case req.URL.Path == "/flaky" && r.flaky.Add(-1) >= 0:
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusTooManyRequests)
		case req.URL.Path == "/stream":
			// The rest comes only once the caller has the first chunk.
			fmt.Fprint(w, "chunk 0\n")
			w.(http.Flusher).Flush()
			select {
			case <-r.release:
				fmt.Fprint(w, "chunk 1\n")
			case <-time.After(5 * time.Second):
				fmt.Fprint(w, "not streamed\n")
			}
		default:
			body, _ := io.ReadAll(req.Body)
			r.seen <- req
			r.bodies <- body
			w.Header().Set("Set-Cookie", "upstream=1")
			w.Header().Set("Connection", "X-Hop")
			w.Header().Set("X-Hop", "1")
			w.Header().Set("X-Upstream", "yes")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte("echo"))
		}
	}))
	r.upstream.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			r.upstreamConns.Add(1)
		}
	}
	r.upstream.Start()
	t.Cleanup(r.upstream.Close)
	cfg := r.sb.OAuth2Config(r.upstream.URL)
	cfg.Endpoint.AuthStyle = oauth2.AuthStyleInHeader
	r.dbURL = testdb.NewEmpty(t)
	db, err := gorm.Open(postgres.Open(r.dbURL), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := tokenguard.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	// Quiet: a log line would cut a benchmark's result line in two.
	quiet := slog.New(slog.DiscardHandler)
	tokens, err := tokenguard.New(db, cfg, tokenguard.WithSkew(100*time.Millisecond), tokenguard.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = tokens.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; _ = tokens.Close(context.Background()) })
	grant, err := sandbox.Grant(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := tokens.Import(ctx, "acme", grant); err != nil {
		t.Fatal(err)
	}
	base, _ := url.Parse(r.upstream.URL)
	r.server = httptest.NewUnstartedServer(nil)
	s := httpapi.New(httpapi.Deps{Tokens: tokens, Keys: oneKey{}, APIBaseURL: base, UserAgent: "tokenguard-server/test", Log: quiet,
		Edges: httpapi.Edges{Hosts: []string{r.server.Listener.Addr().String()}, ProxyMaxBody: 4 << 20, Rate: 1e6, Burst: 1e6}})
	r.server.Config.Handler = s.Handler()
	r.server.Start()
	t.Cleanup(r.server.Close)
	return r
}

// do calls tokenguard with the API key.
func (r *rig) do(method, path string, body io.Reader, header ...string) (*http.Response, string) {
	r.t.Helper()
	req, err := http.NewRequest(method, r.server.URL+path, body)
	if err != nil {
		r.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

type tokenAnswer struct {
	AccessToken string    `json:"access_token"`
	TokenType   string    `json:"token_type"`
	Expiry      time.Time `json:"expiry"`
	Connection  string    `json:"connection"`
	Provider    string    `json:"provider"`
	Version     int64     `json:"version"`
}

func (r *rig) token(resp *http.Response, body string) tokenAnswer {
	r.t.Helper()
	var tok tokenAnswer
	var fields map[string]any
	if resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(body), &tok) != nil || json.Unmarshal([]byte(body), &fields) != nil {
		r.t.Fatalf("token: %d %s", resp.StatusCode, body)
	}
	if len(fields) != 6 || tok.AccessToken == "" || tok.TokenType != "bearer" && tok.TokenType != "Bearer" ||
		tok.Connection != "acme" || fields["provider"] != "" || fields["refresh_token"] != nil || tok.Expiry.IsZero() || tok.Version < 1 {
		r.t.Fatalf("token fields: %s", body)
	}
	if cc := resp.Header.Get("Cache-Control"); cc != "no-store" {
		r.t.Errorf("Cache-Control %q, want no-store", cc)
	}
	return tok
}

// resourceWith calls the sandbox's API directly with an access token.
func (r *rig) resourceWith(token string) int {
	req, _ := http.NewRequest(http.MethodGet, r.upstream.URL+"/resource", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// The token API hands out the cached token, valid past the skew, and a
// refresh after a 401 happens once per stale version, however many
// callers report it: 20 concurrent reports of version v cause one
// rotation at the provider, and every caller gets version v+1.
func TestTokenAPI(t *testing.T) {
	r := newRig(t, time.Hour)
	tok := r.token(r.do("GET", "/connections/acme/token", nil))
	if time.Until(tok.Expiry) < time.Minute {
		t.Errorf("expiry %v: the token handed out must be valid past the skew", tok.Expiry)
	}
	if again := r.token(r.do("GET", "/connections/acme/token", nil)); again != tok {
		t.Errorf("a second GET /token: %+v, want the cached %+v", again, tok)
	}
	if code := r.resourceWith(tok.AccessToken); code != http.StatusOK {
		t.Fatalf("the handed-out token at the API: %d", code)
	}

	var wg sync.WaitGroup
	got := make(chan tokenAnswer, 20)
	for range 20 {
		wg.Go(func() {
			got <- r.token(r.do("POST", "/connections/acme/token/refresh", strings.NewReader(fmt.Sprintf(`{"stale_version":%d}`, tok.Version))))
		})
	}
	wg.Wait()
	close(got)
	var fresh tokenAnswer
	for g := range got {
		if g.Version != tok.Version+1 || (fresh.AccessToken != "" && g.AccessToken != fresh.AccessToken) {
			t.Errorf("refresh after a 401 on version %d: version %d", tok.Version, g.Version)
		}
		fresh = g
	}
	if st := r.sb.Stats(); st.Refreshes != 1 || st.RefreshReuse != 0 {
		t.Errorf("20 reports of one stale version: %d refreshes, %d reuse; want 1, 0", st.Refreshes, st.RefreshReuse)
	}
	if r.resourceWith(tok.AccessToken) != http.StatusUnauthorized || r.resourceWith(fresh.AccessToken) != http.StatusOK {
		t.Error("after the refresh the old token must be revoked and the new one valid")
	}
	// A late report of the old version gets the current token, no refresh.
	if late := r.token(r.do("POST", "/connections/acme/token/refresh", strings.NewReader(fmt.Sprintf(`{"stale_version":%d}`, tok.Version)))); late != fresh {
		t.Errorf("late report: %+v, want %+v", late, fresh)
	}
	if st := r.sb.Stats(); st.Refreshes != 1 {
		t.Errorf("a late report of a replaced version refreshed: %d refreshes", st.Refreshes)
	}
}

// Bad input and tokenguard's own refusals: JSON code and Tokenguard-Error.
func TestTokenAPIErrors(t *testing.T) {
	r := newRig(t, time.Hour)
	for _, c := range []struct {
		method, path, body, key string
		status                  int
		code                    string
	}{
		{"GET", "/connections/acme/token", "", "none", http.StatusUnauthorized, "unauthorized"},
		{"GET", "/connections/acme/token", "", "tgk_wrong", http.StatusUnauthorized, "unauthorized"},
		{"GET", "/connections/nobody/token", "", "", http.StatusNotFound, "not_found"},
		{"GET", "/connections/-bad/token", "", "", http.StatusBadRequest, "invalid_connection"},
		{"POST", "/connections/acme/token/refresh", ``, "", http.StatusBadRequest, "bad_request"},
		{"POST", "/connections/acme/token/refresh", `{}`, "", http.StatusBadRequest, "bad_request"},
		{"POST", "/connections/acme/token/refresh", `{"stale_version":"1"}`, "", http.StatusBadRequest, "bad_request"},
		{"POST", "/connections/acme/token/refresh", `{"stale_version":0}`, "", http.StatusBadRequest, "bad_request"},
		{"POST", "/connections/acme/token/refresh", `{"stale_version":1,"x":1}`, "", http.StatusBadRequest, "bad_request"},
		{"POST", "/connections/nobody/token/refresh", `{"stale_version":1}`, "", http.StatusNotFound, "not_found"},
		{"POST", "/connections/acme/token/refresh", `{"stale_version":1000}`, "", http.StatusConflict, "unknown_version"},
		{"GET", "/connections/acme/proxy/a/%2e%2e/x", "", "", http.StatusBadRequest, "bad_path"},
		{"GET", "/connections/nobody/proxy/resource", "", "", http.StatusNotFound, "not_found"},
	} {
		req, _ := http.NewRequest(c.method, r.server.URL+c.path, strings.NewReader(c.body))
		switch c.key {
		case "":
			req.Header.Set("Authorization", "Bearer "+apiKey)
		case "none":
		default:
			req.Header.Set("Authorization", "Bearer "+c.key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e struct{ Error, Code string }
		err = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != c.status || err != nil || e.Code != c.code || resp.Header.Get("Tokenguard-Error") != c.code {
			t.Errorf("%s %s %s: %d %+v Tokenguard-Error %q, want %d %s", c.method, c.path, c.body, resp.StatusCode, e,
				resp.Header.Get("Tokenguard-Error"), c.status, c.code)
		}
	}
	if st := r.sb.Stats(); st.Refreshes != 0 {
		t.Errorf("bad input caused %d refreshes", st.Refreshes)
	}
}

// The proxy forwards method, path, query, body and the allowlisted
// headers with the token instead of the API key, and answers with the
// upstream's status and headers, hop-by-hop ones and cookies removed.
func TestProxyForwards(t *testing.T) {
	r := newRig(t, time.Hour)
	resp, body := r.do("PATCH", "/connections/acme/proxy/v1/items/42?fields=a,b&x=%20y", strings.NewReader(`{"n":1}`),
		"Content-Type", "application/json", "Idempotency-Key", "k1", "Cookie", "session=secret", "X-Custom", "no")
	if resp.StatusCode != http.StatusCreated || body != "echo" {
		t.Fatalf("proxy: %d %s", resp.StatusCode, body)
	}
	up, upBody := <-r.seen, <-r.bodies
	tok := r.token(r.do("GET", "/connections/acme/token", nil))
	if up.Method != "PATCH" || up.URL.Path != "/v1/items/42" || up.URL.RawQuery != "fields=a,b&x=%20y" || string(upBody) != `{"n":1}` {
		t.Errorf("upstream got %s %s?%s %q", up.Method, up.URL.Path, up.URL.RawQuery, upBody)
	}
	if up.Header.Get("Authorization") != "Bearer "+tok.AccessToken || up.Header.Get("Content-Type") != "application/json" ||
		up.Header.Get("Idempotency-Key") != "k1" || up.Header.Get("Cookie") != "" || up.Header.Get("X-Custom") != "" ||
		up.UserAgent() != "tokenguard-server/test" {
		t.Errorf("upstream headers: %v", up.Header)
	}
	if resp.Header.Get("Set-Cookie") != "" || resp.Header.Get("X-Hop") != "" || resp.Header.Get("X-Upstream") != "yes" ||
		resp.Header.Get("Tokenguard-Error") != "" {
		t.Errorf("answer headers: %v", resp.Header)
	}
	// The route of the apps is the proxy at /resource.
	if resp, body := r.do("GET", "/connections/acme/resource", nil); resp.StatusCode != http.StatusOK || !strings.Contains(body, `"ok":true`) {
		t.Errorf("resource: %d %s", resp.StatusCode, body)
	}
	// Streamed: the first chunk arrives before the upstream has finished.
	req, _ := http.NewRequest("GET", r.server.URL+"/connections/acme/proxy/stream", nil)
	req.Header.Set("Authorization", "Bearer "+apiKey)
	sresp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, len("chunk 0\n"))
	_, err = io.ReadFull(sresp.Body, first)
	close(r.release)
	rest, _ := io.ReadAll(sresp.Body)
	sresp.Body.Close()
	if err != nil || string(first) != "chunk 0\n" || string(rest) != "chunk 1\n" {
		t.Errorf("stream: first %q, rest %q", first, rest)
	}
	// Over PROXY_MAX_BODY: 413, tokenguard's.
	resp, _ = r.do("POST", "/connections/acme/proxy/v1/upload", bytes.NewReader(make([]byte, 5<<20)))
	if resp.StatusCode != http.StatusRequestEntityTooLarge || resp.Header.Get("Tokenguard-Error") != "too_large" {
		t.Errorf("body over the limit: %d %v", resp.StatusCode, resp.Header)
	}
}

// A 401 from the API is recovered by one version-conditional refresh and
// one retry when the request can be replayed; a body too large to hold is
// sent once and the caller gets the API's 401, without Tokenguard-Error.
func TestProxyRecovers401(t *testing.T) {
	r := newRig(t, time.Hour)
	old := r.token(r.do("GET", "/connections/acme/token", nil))
	r.deny.Store(1)
	if resp, body := r.do("GET", "/connections/acme/proxy/resource", nil); resp.StatusCode != http.StatusOK || !strings.Contains(body, `"ok":true`) {
		t.Fatalf("after one 401: %d %s", resp.StatusCode, body)
	}
	now := r.token(r.do("GET", "/connections/acme/token", nil))
	if st := r.sb.Stats(); st.Refreshes != 1 || now.Version != old.Version+1 {
		t.Errorf("one 401: %d refreshes, version %d → %d; want one refresh", st.Refreshes, old.Version, now.Version)
	}
	// Control: a body over the replay buffer cannot be sent twice.
	r.deny.Store(1)
	resp, body := r.do("POST", "/connections/acme/proxy/resource", bytes.NewReader(make([]byte, 2<<20)))
	if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("Tokenguard-Error") != "" || body != "" {
		t.Errorf("unreplayable body after a 401: %d %q %v, want the API's own 401", resp.StatusCode, body, resp.Header)
	}
	if st := r.sb.Stats(); st.Refreshes != 1 {
		t.Errorf("unreplayable request: %d refreshes, want still 1", st.Refreshes)
	}
}

// 429 with Retry-After is retried for an idempotent method or with an
// Idempotency-Key, never for a bare POST.
func TestProxyRetryAfter(t *testing.T) {
	r := newRig(t, time.Hour)
	for _, c := range []struct {
		method string
		header []string
		status int
	}{
		{"GET", nil, http.StatusCreated},
		{"PUT", nil, http.StatusCreated},
		{"POST", []string{"Idempotency-Key", "k"}, http.StatusCreated},
		{"POST", nil, http.StatusTooManyRequests},
	} {
		r.flaky.Store(2)
		resp, _ := r.do(c.method, "/connections/acme/proxy/flaky", strings.NewReader("x"), c.header...)
		if resp.StatusCode != c.status {
			t.Errorf("%s %v after two 429s: %d, want %d", c.method, c.header, resp.StatusCode, c.status)
		}
		for len(r.seen) > 0 {
			<-r.seen
			<-r.bodies
		}
	}
	r.flaky.Store(3) // more than the retries
	if resp, _ := r.do("GET", "/connections/acme/proxy/flaky", nil); resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Tokenguard-Error") != "" {
		t.Errorf("three 429s: %d, want the API's 429", resp.StatusCode)
	}
}
