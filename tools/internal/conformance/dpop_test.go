package conformance_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
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
	"github.com/tokenguard/tokenguard/infra/dpop"
	"github.com/tokenguard/tokenguard/internal/testdb"
	"github.com/tokenguard/tokenguard/tools/internal/conformance"
)

// dpopWorld is oidc-provider requiring DPoP-bound grants (a public client,
// so its refresh tokens are bound too, RFC 9449 §5), the resource server
// that verifies proofs, and three stacks sharing one bound connection.
type dpopWorld struct {
	n      *nodeServer
	d      discovery
	cfg    *oauth2.Config
	rs     *conformance.DPoPResource
	api    string
	stacks []*tokenguard.Tokens
	dsn    string
}

const dpopConn = "dpop-conn"

func newDPoPWorld(t *testing.T, stacks int, opts ...tokenguard.Option) *dpopWorld {
	return newSenderWorld(t, stacks, "dpop-public", nil, opts...)
}

// newSenderWorld is the DPoP server with clientID as the stacks' client,
// serverEnv given to it, and opts to every stack.
func newSenderWorld(t *testing.T, stacks int, clientID string, serverEnv []string, opts ...tokenguard.Option) *dpopWorld {
	w := &dpopWorld{n: startNodeServer(t, "oidcdpop", serverEnv...)}
	w.d = discover(t, w.n.issuer)
	w.cfg = &oauth2.Config{
		ClientID: clientID, RedirectURL: redirectURI, Scopes: []string{"openid", "offline_access"},
		Endpoint: oauth2.Endpoint{AuthURL: w.d.Authorization, TokenURL: w.d.Token, AuthStyle: oauth2.AuthStyleInParams},
	}
	w.rs = &conformance.DPoPResource{IntrospectionURL: w.d.Introspection, ClientID: "resource-server", Secret: clientSecret, NonceTTL: 400 * time.Millisecond}
	api := httptest.NewServer(w.rs)
	t.Cleanup(api.Close)
	w.api = api.URL + conformance.Path
	w.dsn = testdb.New(t)
	for range stacks {
		w.stacks = append(w.stacks, w.newStack(t, opts...))
	}
	return w
}

// newStack is one more running stack on the world's database.
func (w *dpopWorld) newStack(t *testing.T, opts ...tokenguard.Option) *tokenguard.Tokens {
	db := w.openDB(t)
	tg, err := tokenguard.New(db, w.cfg, append([]tokenguard.Option{tokenguard.WithSkew(skew),
		tokenguard.WithLogger(slog.New(slog.DiscardHandler))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = tg.Run(ctx) }()
	t.Cleanup(func() { _ = tg.Close(context.Background()); cancel(); <-done })
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if err := tg.WaitReady(wctx); err != nil {
		t.Fatalf("stack: %v", err)
	}
	return tg
}

// grant runs the authorization code flow with a proof of key on the code
// exchange: the grant (access and refresh token) is bound to key.
func (w *dpopWorld) grant(t *testing.T, key *ecdsa.PrivateKey) *oauth2.Token {
	k, err := dpop.FromSigner(key)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &dpop.TokenTransport{Nonces: &dpop.Nonces{}}}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	ctx = dpop.WithKey(context.WithValue(ctx, oauth2.HTTPClient, hc), k)
	tok, err := browserGrant(ctx, w.cfg, func(page string, form url.Values) bool {
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
	if err != nil {
		t.Fatalf("bound grant: %v", err)
	}
	if tok.RefreshToken == "" || !strings.EqualFold(tok.Type(), "DPoP") {
		t.Fatalf("bound grant: token_type %q, refresh token present %v", tok.Type(), tok.RefreshToken != "")
	}
	return tok
}

func (w *dpopWorld) events(match func(map[string]any) bool) int { return w.n.count(match) }

func refreshEvent(event, errCode string) func(map[string]any) bool {
	return func(ev map[string]any) bool {
		return ev["event"] == event && ev["grant_type"] == "refresh_token" && (errCode == "" || ev["error"] == errCode)
	}
}

// TestDPoPBoundGrantSharedByThreeStacks: three stacks share one
// DPoP-bound connection under load at oidc-provider (DPoP required with
// nonces, bound rotating refresh tokens) and a resource server that
// verifies every proof: no refresh token presented twice, one refresh per
// expiry, every call's proof accepted, nonces learned at both servers.
func TestDPoPBoundGrantSharedByThreeStacks(t *testing.T) {
	w := newDPoPWorld(t, 3, tokenguard.WithDPoP())
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tok := w.grant(t, key)
	ctx := context.Background()
	if err := w.stacks[0].Import(ctx, dpopConn, tok, tokenguard.WithDPoPKey(key)); err != nil {
		t.Fatalf("import: %v", err)
	}
	first, err := w.stacks[0].Repository().Get(ctx, dpopConn)
	if err != nil {
		t.Fatal(err)
	}
	k, _ := dpop.FromSigner(key)
	if first.DPoPJKT != k.Thumbprint() {
		t.Fatalf("stored binding %q, want the key's thumbprint %q", first.DPoPJKT, k.Thumbprint())
	}

	start := time.Now()
	calls, failures := w.load(t, 4*lifetime)
	elapsed := time.Since(start)

	last, err := w.stacks[0].Repository().Get(ctx, dpopConn)
	if err != nil {
		t.Fatal(err)
	}
	refreshes := int(last.Version - first.Version)
	succeeded := w.events(refreshEvent("grant.success", ""))
	reuse := w.events(func(ev map[string]any) bool { return ev["reuse"] == true })
	nonceRefusals := w.events(refreshEvent("grant.error", "use_dpop_nonce"))
	otherErrors := w.events(refreshEvent("grant.error", "")) - nonceRefusals
	rs := w.rs.Snapshot()
	t.Logf("calls %d (failed %d) in %v; refreshes stored %d, at the server %d; token endpoint nonce refusals %d; resource: accepted %d, nonce refusals %d, nonces %d, refused %v",
		calls, failures, elapsed.Round(time.Millisecond), refreshes, succeeded, nonceRefusals, rs.Accepted, rs.NonceRefused, rs.Nonces, rs.Refused)
	switch {
	case failures != 0:
		t.Errorf("%d of %d calls failed", failures, calls)
	case reuse != 0:
		t.Errorf("oidc-provider saw %d rotated refresh tokens presented again", reuse)
	case otherErrors != 0:
		t.Errorf("oidc-provider refused %d refreshes for other reasons than a nonce", otherErrors)
	case succeeded != refreshes:
		t.Errorf("the server granted %d refreshes, the store kept %d: a refresh was lost or doubled", succeeded, refreshes)
	case refreshes < 2 || refreshes > int(elapsed/(lifetime-skew))+1:
		t.Errorf("%d refreshes in %v with a token due every %v: not one per expiry", refreshes, elapsed, lifetime-skew)
	case nonceRefusals == 0:
		t.Errorf("the token endpoint never asked for a nonce: the retry with the nonce was not exercised")
	case len(rs.Refused) != 0 || rs.Accepted != calls:
		t.Errorf("the resource server refused proofs: %v (accepted %d of %d calls)", rs.Refused, rs.Accepted, calls)
	case rs.NonceRefused == 0 || rs.Nonces < 3:
		t.Errorf("resource nonces did not rotate under load (refusals %d, nonces %d)", rs.NonceRefused, rs.Nonces)
	}
	w.controls(t, last)
	w.httpSurfaces(t)
}

// load calls the API through every stack's Client for d.
func (w *dpopWorld) load(t *testing.T, d time.Duration) (calls, failures int) {
	var ok, bad atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	var once sync.Once
	for i, st := range w.stacks {
		for g := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				hc := st.Client(context.Background(), dpopConn)
				for n := 0; time.Now().Before(deadline); n++ {
					resp, err := hc.Get(fmt.Sprintf("%s?stack=%d&g=%d&n=%d", w.api, i, g, n))
					if err != nil {
						bad.Add(1)
						once.Do(func() { t.Logf("call failed: %v", err) })
						continue
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						bad.Add(1)
						once.Do(func() { t.Logf("call answered %d %s", resp.StatusCode, resp.Header.Get("WWW-Authenticate")) })
						continue
					}
					ok.Add(1)
					time.Sleep(20 * time.Millisecond)
				}
			}()
		}
	}
	wg.Wait()
	return int(ok.Load() + bad.Load()), int(bad.Load())
}

// controls: the bare token is refused by the library; the access token
// replayed without a proof, or with a proof of another key, is refused by
// the resource server; a refresh signed with another key is refused by
// the authorization server before the refresh token is spent.
func (w *dpopWorld) controls(t *testing.T, last domain.Token) {
	ctx := context.Background()
	if _, err := w.stacks[1].Token(ctx, dpopConn); !errors.Is(err, tokenguard.ErrSenderConstrained) {
		t.Errorf("Token on a DPoP-bound connection: %v, want ErrSenderConstrained", err)
	}
	at := last.AccessToken.Reveal()
	for _, scheme := range []string{"Bearer", "DPoP"} {
		req, _ := http.NewRequest(http.MethodGet, w.api, nil)
		req.Header.Set("Authorization", scheme+" "+at)
		if code := answerStatus(t, http.DefaultClient, req); code != http.StatusUnauthorized {
			t.Errorf("access token replayed without a proof (%s): %d, want 401", scheme, code)
		}
	}
	other, _ := dpop.Generate()
	nonces := &dpop.Nonces{}
	for range 2 { // the first may be refused for want of the nonce
		req, _ := http.NewRequest(http.MethodGet, w.api, nil)
		signed, err := dpop.Authorize(req, other, at, nonces, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(signed)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if nonces.Learn(w.api, resp.Header) && dpop.NonceRefused(resp.StatusCode, resp.Header, nil) {
			continue
		}
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("a proof of another key: %d, want 401", resp.StatusCode)
		}
		break
	}
	if got := w.rs.Snapshot().Refused["key_mismatch"]; got == 0 {
		t.Errorf("the resource server did not refuse the other key's proof as a key mismatch")
	}
	w.foreignRefresh(t, other, last)
}

// foreignRefresh presents the stored refresh token with a proof of
// another key: oidc-provider refuses it (failed jkt verification) before
// spending it, so the fleet's next refresh, with the grant's key, works.
func (w *dpopWorld) foreignRefresh(t *testing.T, other *dpop.Key, _ domain.Token) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cur, err := w.stacks[0].Repository().Get(ctx, dpopConn)
	if err != nil {
		t.Fatal(err)
	}
	form := url.Values{"grant_type": {"refresh_token"}, "refresh_token": {cur.RefreshToken.Reveal()}, "client_id": {w.cfg.ClientID}}
	req, _ := http.NewRequestWithContext(dpop.WithKey(ctx, other), http.MethodPost, w.d.Token, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	hc := &http.Client{Transport: &dpop.TokenTransport{Nonces: &dpop.Nonces{}}}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "invalid_grant") {
		t.Errorf("a refresh signed with another key: %d, want 400 invalid_grant", resp.StatusCode)
	}
	if _, err := w.stacks[2].ForceRefresh(ctx, dpopConn, cur.Version); err != nil {
		t.Errorf("refresh with the grant's key after the foreign attempt: %v (the refresh token must be unspent)", err)
	}
	if reuse := w.events(func(ev map[string]any) bool { return ev["reuse"] == true }); reuse != 0 {
		t.Errorf("oidc-provider saw %d refresh tokens presented again", reuse)
	}
}

func answerStatus(t *testing.T, c *http.Client, req *http.Request) int {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestDPoPConnectFlowMakesTheKey: the connect flow of a provider that
// requires DPoP makes a key at the code exchange, keeps it sealed with
// the pending result, and stores it with the grant; the grant refreshes
// and calls with it.
func TestDPoPConnectFlowMakesTheKey(t *testing.T) {
	w := newDPoPWorld(t, 1, tokenguard.WithDPoP())
	tg := w.stacks[0]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	w.connect(t, tg, "flow-conn")
	stored, err := tg.Repository().Get(ctx, "flow-conn")
	if err != nil || stored.DPoPJKT == "" {
		t.Fatalf("stored grant: %v, binding %q", err, stored.DPoPJKT)
	}
	if _, err := tg.ForceRefresh(ctx, "flow-conn", stored.Version); err != nil {
		t.Fatalf("refresh of the connected grant: %v", err)
	}
	resp, err := tg.Client(ctx, "flow-conn").Get(w.api)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("call with the connected grant: %d", resp.StatusCode)
	}
	if reuse := w.events(func(ev map[string]any) bool { return ev["reuse"] == true }); reuse != 0 {
		t.Fatalf("%d refresh tokens presented again", reuse)
	}
}

// connect runs tokenguard's connect flow for name through the server's
// login and consent pages, and redeems the result.
func (w *dpopWorld) connect(t *testing.T, tg *tokenguard.Tokens, name string) {
	t.Helper()
	if _, err := w.connectVia(t, tg, tokenguard.ConnectFlow{Connection: name}); err != nil {
		t.Fatal(err)
	}
}

// connectVia runs the connect flow f through the server's pages and
// redeems the result; it returns the URL the browser was sent to, and the
// error of the authorization pages.
func (w *dpopWorld) connectVia(t *testing.T, tg *tokenguard.Tokens, f tokenguard.ConnectFlow) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	authURL, f, err := tg.AuthCodeURL(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	q, err := browserCallback(ctx, authURL, redirectURI, func(page string, form url.Values) bool {
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
	if err != nil {
		return authURL, err
	}
	res, err := tg.Complete(ctx, f, q)
	if err != nil {
		w.events(func(ev map[string]any) bool { t.Logf("event %v", ev); return false })
		t.Fatalf("complete: %v", err)
	}
	if _, err := tg.Redeem(ctx, res.Code); err != nil {
		t.Fatalf("redeem: %v", err)
	}
	return authURL, nil
}

// openDB is a pool of its own on the world's database.
func (w *dpopWorld) openDB(t *testing.T) *gorm.DB {
	db, err := gorm.Open(postgres.Open(w.dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	sqlDB, _ := db.DB()
	sqlDB.SetMaxOpenConns(4)
	t.Cleanup(func() { _ = sqlDB.Close() })
	return db
}
