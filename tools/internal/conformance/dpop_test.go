package conformance_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
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
	for i := range stacks {
		tg, _ := w.startStack(t, i, opts...)
		w.stacks = append(w.stacks, tg)
	}
	return w
}

// newStack is one more running stack on the world's database.
func (w *dpopWorld) newStack(t *testing.T, opts ...tokenguard.Option) *tokenguard.Tokens {
	tg, _ := w.startStack(t, len(w.stacks), opts...)
	return tg
}

// startStack is a running stack on the world's database; stop closes it
// (at the latest when the test ends).
func (w *dpopWorld) startStack(t *testing.T, i int, opts ...tokenguard.Option) (tg *tokenguard.Tokens, stop func()) {
	db := w.openDB(t)
	tg, err := tokenguard.New(db, w.cfg, append([]tokenguard.Option{tokenguard.WithSkew(skew),
		tokenguard.WithLogger(slog.New(slog.DiscardHandler).With("stack", i))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = tg.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { _ = tg.Close(context.Background()); cancel(); <-done }) }
	t.Cleanup(stop)
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if err := tg.WaitReady(wctx); err != nil {
		t.Fatalf("stack %d: %v", i, err)
	}
	return tg, stop
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

// eventsUpTo counts the server's events that match, waiting (at most 10 s)
// until there are want of them: the server's log reaches this process a
// little after its answer does.
func (w *dpopWorld) eventsUpTo(want int, match func(map[string]any) bool) int {
	deadline := time.Now().Add(10 * time.Second)
	n := w.events(match)
	for n < want && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		n = w.events(match)
	}
	return n
}

func refreshEvent(event, errCode string) func(map[string]any) bool {
	return func(ev map[string]any) bool {
		return ev["event"] == event && ev["grant_type"] == "refresh_token" && (errCode == "" || ev["error"] == errCode)
	}
}

// TestDPoPBoundGrantSharedByThreeProcesses: three OS processes share one
// DPoP-bound connection under load at oidc-provider (DPoP required with
// nonces, bound rotating refresh tokens) and a resource server that
// verifies every proof: no refresh token presented twice, one refresh per
// expiry, every call's proof accepted, nonces learned at both servers.
// The controls run from this process, which holds another key.
func TestDPoPBoundGrantSharedByThreeProcesses(t *testing.T) {
	w := newDPoPWorld(t, 0)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tok := w.grant(t, key)
	ctx := context.Background()
	importer, stop := w.startStack(t, 0, tokenguard.WithDPoP())
	if err := importer.Import(ctx, dpopConn, tok, tokenguard.WithDPoPKey(key)); err != nil {
		t.Fatalf("import: %v", err)
	}
	first, err := importer.Repository().Get(ctx, dpopConn)
	if err != nil {
		t.Fatal(err)
	}
	stop() // the sharers are the three processes alone
	k, _ := dpop.FromSigner(key)
	if first.DPoPJKT != k.Thumbprint() {
		t.Fatalf("stored binding %q, want the key's thumbprint %q", first.DPoPJKT, k.Thumbprint())
	}

	// The controls' stacks, started now so that they run while the last
	// access token is still fresh; they make no call during the load.
	for i := range 3 {
		tg, _ := w.startStack(t, i, tokenguard.WithDPoP())
		w.stacks = append(w.stacks, tg)
	}
	sharers, elapsed, asNonces := w.loadFromProcesses(t, 3, 4*lifetime)
	calls, failures := 0, 0
	for _, s := range sharers {
		calls, failures = calls+s.Calls, failures+s.Failures
	}
	last, err := w.stacks[0].Repository().Get(ctx, dpopConn)
	if err != nil {
		t.Fatal(err)
	}
	refreshes := int(last.Version - first.Version)
	succeeded := w.eventsUpTo(refreshes, refreshEvent("grant.success", ""))
	reuse := w.events(func(ev map[string]any) bool { return ev["reuse"] == true })
	nonceRefusals := w.events(refreshEvent("grant.error", "use_dpop_nonce"))
	otherErrors := w.events(refreshEvent("grant.error", "")) - nonceRefusals
	rs := w.rs.Snapshot()
	t.Logf("processes %v: calls %d (failed %d) in %v; refreshes stored %d, at the server %d; token endpoint nonce refusals %d, nonces %d; resource: accepted %d, nonce refusals %d, nonces %d, refused %v",
		sharers, calls, failures, elapsed.Round(time.Millisecond), refreshes, succeeded, nonceRefusals, len(asNonces), rs.Accepted, rs.NonceRefused, rs.Nonces, rs.Refused)
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
	case len(asNonces) < 2:
		t.Errorf("the token endpoint's nonce did not change under load (%d handed out)", len(asNonces))
	case len(proofRefusals(rs.Refused)) != 0 || rs.Accepted != calls:
		t.Errorf("the resource server refused proofs: %v (accepted %d of %d calls)", rs.Refused, rs.Accepted, calls)
	case rs.NonceRefused < len(sharers) || rs.Nonces < 3:
		t.Errorf("resource nonces did not rotate under load, or a process never learned one (refusals %d, nonces %d)", rs.NonceRefused, rs.Nonces)
	}
	for i, s := range sharers {
		if s.Calls == 0 {
			t.Errorf("process %d made no call: the connection was not shared", i)
		}
	}
	// The controls need a live access token: the load's last one may
	// have expired while the processes exited.
	if _, err := w.stacks[0].ForceRefresh(ctx, dpopConn, last.Version); err != nil {
		t.Fatalf("refresh for the controls: %v", err)
	}
	if last, err = w.stacks[0].Repository().Get(ctx, dpopConn); err != nil {
		t.Fatal(err)
	}
	w.controls(t, last)
	w.httpSurfaces(t)
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
	req, _ := http.NewRequest(http.MethodGet, w.api, nil)
	// The first may be refused for want of the nonce: Send sends it once more.
	resp, err := dpop.Send(http.DefaultTransport, req, other, at, &dpop.Nonces{}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a proof of another key: %d, want 401", resp.StatusCode)
	}
	if got := w.rs.Snapshot().Refused; got["key_mismatch"] == 0 {
		t.Errorf("the resource server did not refuse the other key's proof as a key mismatch (refusals %v)", got)
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

// proofRefusals is the resource server's refusals without inactive_token.
// An access token checked fresh (a second before it is due) can be
// inactive by the time a loaded machine has carried it to the resource
// server and introspected it; the client recovers such a call (the check
// accepted == calls holds it to that). Every other reason is a proof or a
// binding the server rejected, which no timing explains.
func proofRefusals(refused map[string]int) map[string]int {
	out := map[string]int{}
	for reason, n := range refused {
		if reason != "inactive_token" {
			out[reason] = n
		}
	}
	return out
}
