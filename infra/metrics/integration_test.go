package metrics_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/di"
	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/metrics"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/testdb"
	"github.com/tokenguard/tokenguard/internal/waitfor"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// process is one app's token layer, wired by di as the apps wire it, with
// its metrics served by the server's real /metrics route.
type process struct {
	name   string
	tokens *di.Tokens
	scrape http.Handler
}

// TestMetricsAgreeWithTheProvider runs two processes against the strict
// provider across several expiries, then checks what /metrics says
// against what the provider counted.
func TestMetricsAgreeWithTheProvider(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	const (
		lifetime = 1500 * time.Millisecond
		skew     = 500 * time.Millisecond // a refresh every second per connection
		load     = 3200 * time.Millisecond
	)
	f := newFleet(t, lifetime, skew)
	forced := f.callUnderLoad(t, load)
	st := f.provider.Stats()
	if st.Refreshes < 4 || st.RefreshReuse != 0 {
		t.Fatalf("the run itself went wrong: %+v", st)
	}
	// Every notification reaches both processes (each hears its own too).
	for _, pr := range f.procs {
		waitfor.Until(t, 5*time.Second, pr.name+": invalidations fewer than refreshes", func() bool {
			fams, _ := scrape(t, pr.scrape)
			return value(fams, "tokenguard_token_invalidations_total") >= float64(st.Refreshes)
		})
	}
	f.checkCounters(t, st, forced)
	f.checkRevokedGrantCounted(t, skew)
}

// fleet is two processes (server and worker) sharing the connections acme
// and globex at the strict sandbox provider.
type fleet struct {
	provider *sandbox.Provider
	base     string // the provider's URL
	procs    []*process
	conns    []string
}

// newFleet wires both processes from the environment, as the apps do,
// connects the connections and waits until both caches are trusted.
func newFleet(t *testing.T, lifetime, skew time.Duration) *fleet {
	p, err := sandbox.New(sandbox.Options{AccessTokenLifespan: lifetime})
	if err != nil {
		t.Fatal(err)
	}
	psrv := httptest.NewServer(p.Handler())
	t.Cleanup(psrv.Close)
	oc := p.OAuth2Config(psrv.URL)
	cfg, err := di.ConfigFromEnv([]string{
		"DATABASE_URL=" + testdb.New(t), "OAUTH_TOKEN_URL=" + oc.Endpoint.TokenURL,
		"OAUTH_CLIENT_ID=" + oc.ClientID, "OAUTH_CLIENT_SECRET=" + oc.ClientSecret,
		"TOKEN_REFRESH_SKEW=" + skew.String(), "TOKEN_LOCK_WAIT=5s", "TOKEN_REFRESH_TIMEOUT=3s",
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	f := &fleet{provider: p, base: psrv.URL, conns: []string{"acme", "globex"}}
	for _, name := range []string{"server", "worker"} {
		reg := metrics.NewRegistry()
		tokens, cleanup, err := di.NewTokens(ctx, cfg, nil, di.TokenOptions{App: name, Registry: reg})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cleanup)
		f.procs = append(f.procs, &process{name: name, tokens: tokens,
			scrape: metrics.HandlerFor(reg, nil)}) // the server serves this behind an API key (httpapi tests)
	}
	for _, name := range f.conns {
		tok, err := sandbox.Grant(ctx, oc)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.procs[0].tokens.Guard.ConnectUseCase().Connect(ctx, name, provider.GrantFrom(tok)); err != nil {
			t.Fatal(err)
		}
	}
	for _, pr := range f.procs { // both listeners up: caches trusted
		waitfor.Until(t, 5*time.Second, pr.name+": listener never connected", func() bool {
			fams, _ := scrape(t, pr.scrape)
			return value(fams, "tokenguard_token_listener_connected") == 1
		})
	}
	return f
}

// callUnderLoad has each process call the protected API with its token
// for load; a call answered 401 (its token was revoked by the other
// process's refresh while in flight) asks for a newer one, as the API
// client does. It fails t if any call failed, and returns how many forced
// refreshes the callers asked for.
func (f *fleet) callUnderLoad(t *testing.T, load time.Duration) (forced int64) {
	ctx := context.Background()
	var forcedN, calls, failed atomic.Int64
	loadCtx, stop := context.WithTimeout(ctx, load)
	defer stop()
	var wg sync.WaitGroup
	for _, pr := range f.procs {
		for g := range 4 {
			wg.Go(func() {
				for n := g; loadCtx.Err() == nil; n++ {
					name := f.conns[n%len(f.conns)]
					tok, err := pr.tokens.RefreshToken.Token(ctx, name)
					if err != nil {
						t.Errorf("%s: %v", pr.name, err)
						return
					}
					status := callResource(t, f.base, tok.AccessToken.Reveal())
					if status == http.StatusUnauthorized {
						forcedN.Add(1)
						if tok, err = pr.tokens.RefreshToken.ForceRefresh(ctx, name, tok.Version); err == nil {
							status = callResource(t, f.base, tok.AccessToken.Reveal())
						}
					}
					calls.Add(1)
					if status != http.StatusOK {
						failed.Add(1)
					}
					time.Sleep(5 * time.Millisecond) // a caller's pace, not a wait
				}
			})
		}
	}
	wg.Wait()
	st := f.provider.Stats()
	t.Logf("%d calls, %d failed, %d forced; provider: %d refreshes, %d reuse, %d × 401", calls.Load(), failed.Load(), forcedN.Load(), st.Refreshes, st.RefreshReuse, st.Resource401)
	if failed.Load() != 0 {
		t.Fatalf("the run itself went wrong: %d failed calls", failed.Load())
	}
	return forcedN.Load()
}

// checkCounters checks each process's /metrics against what the provider
// counted (st) and the forced refreshes the callers asked for.
func (f *fleet) checkCounters(t *testing.T, st sandbox.Stats, forced int64) {
	var okSum, forcedSum float64
	byAgent := map[string]int{}
	for _, r := range f.provider.Timeline().Refreshes {
		byAgent[r.Agent]++
	}
	for _, pr := range f.procs {
		fams, body := scrape(t, pr.scrape)
		ok := value(fams, "tokenguard_token_refreshes_total", "outcome", "ok")
		all := value(fams, "tokenguard_token_refreshes_total")
		called := ok + value(fams, "tokenguard_token_refreshes_total", "outcome", "transient_error") +
			value(fams, "tokenguard_token_refreshes_total", "outcome", "invalid_grant")
		okSum += ok
		forcedSum += value(fams, "tokenguard_token_forced_refresh_requests_total")
		// The provider saw this process's User-Agent on exactly its refreshes.
		if got := byAgent["tokenguard-"+pr.name]; float64(got) != ok {
			t.Errorf("%s: refreshes{outcome=ok} = %v, the provider saw %d from tokenguard-%s", pr.name, ok, got, pr.name)
		}
		if got := value(fams, "tokenguard_token_lock_wait_seconds"); got != all || all == 0 {
			t.Errorf("%s: %v lock waits for %v passes through the lock", pr.name, got, all)
		}
		if got := value(fams, "tokenguard_provider_refresh_duration_seconds"); got != called {
			t.Errorf("%s: %v provider latencies for %v provider calls", pr.name, got, called)
		}
		if hit, miss := value(fams, "tokenguard_token_cache_lookups_total", "result", "hit"), value(fams, "tokenguard_token_cache_lookups_total", "result", "miss"); hit <= miss || miss == 0 {
			t.Errorf("%s: cache hits %v, misses %v", pr.name, hit, miss)
		}
		if a, n := value(fams, "tokenguard_connections", "status", "active"), value(fams, "tokenguard_connections", "status", "needs_reauth"); a != 2 || n != 0 {
			t.Errorf("%s: connections active=%v needs_reauth=%v, want 2 and 0", pr.name, a, n)
		}
		for _, name := range f.conns {
			if strings.Contains(body, name) {
				t.Errorf("%s: connection %q is a label by default", pr.name, name)
			}
		}
		assertNoSecret(t, body, f.procs[0].tokens, f.conns)
	}
	if okSum != float64(st.Refreshes) {
		t.Errorf("refreshes{outcome=ok} over both processes = %v, provider counted %d", okSum, st.Refreshes)
	}
	if forcedSum != float64(forced) {
		t.Errorf("forced refresh requests = %v, callers asked %d times", forcedSum, forced)
	}
}

// checkRevokedGrantCounted has the provider revoke the grants: at its
// next refresh acme is found dead and moves to needs_reauth, in the gauge
// of both processes, and the refresh that found it counts in the first.
func (f *fleet) checkRevokedGrantCounted(t *testing.T, skew time.Duration) {
	ctx := context.Background()
	f.provider.RevokeAll()
	tok, err := f.procs[0].tokens.Repository.Get(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	// The sandbox's token expires by the real clock.
	time.Sleep(time.Until(tok.Expiry.Add(-tok.EffectiveSkew(skew))) + 10*time.Millisecond)
	if _, err := f.procs[0].tokens.RefreshToken.Token(ctx, "acme"); !errors.Is(err, domain.ErrNeedsReauth) {
		t.Fatalf("after RevokeAll: %v, want needs reauth", err)
	}
	for i, pr := range f.procs {
		fams, _ := scrape(t, pr.scrape)
		if a, n := value(fams, "tokenguard_connections", "status", "active"), value(fams, "tokenguard_connections", "status", "needs_reauth"); a != 1 || n != 1 {
			t.Errorf("%s: connections active=%v needs_reauth=%v, want 1 and 1", pr.name, a, n)
		}
		want := 0.0
		if i == 0 {
			want = 1
		}
		if got := value(fams, "tokenguard_token_refreshes_total", "outcome", "invalid_grant"); got != want {
			t.Errorf("%s: refreshes{outcome=invalid_grant} = %v, want %v", pr.name, got, want)
		}
	}
}

func callResource(t *testing.T, base, accessToken string) int {
	req, _ := http.NewRequest(http.MethodGet, base+"/resource", nil)
	req.Header.Set("Authorization", "Bearer "+accessToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("resource: %v", err)
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// assertNoSecret fails if body holds any stored token value.
func assertNoSecret(t *testing.T, body string, tokens *di.Tokens, conns []string) {
	t.Helper()
	for _, name := range conns {
		tok, err := tokens.Repository.Get(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []domain.Secret{tok.AccessToken, tok.RefreshToken} {
			if v := s.Reveal(); len(v) < 8 || strings.Contains(body, v) {
				t.Fatalf("a token of %s is in /metrics (or too short to check)", name)
			}
		}
	}
}
