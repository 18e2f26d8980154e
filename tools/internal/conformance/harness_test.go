package conformance_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenguard/tokenguard/di"
	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/apiclient"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/repository"
)

// skew is TOKEN_REFRESH_SKEW: with 2 s tokens a token is due 1 s after it
// was granted.
const skew = time.Second

// stack is what one app process holds, built the way the apps build it
// (di.NewTokens on the root package tokenguard: its own pool, cache,
// change listener, provider client and retry policy), plus the API client
// the apps use.
type stack struct {
	tokens  *di.Tokens
	metrics *prometheus.Registry
	api     *apiclient.Client
	log     *syncBuffer
}

// env is one scenario's world: a server, its database, and the stacks.
type env struct {
	t      *testing.T
	r      *run
	s      *server
	db     string
	stacks []*stack
}

// newStacks starts n stacks configured from the environment variables an
// operator would set. authStyle "" leaves OAUTH_AUTH_STYLE at its default.
func newStacks(r *run, n int, authStyle string) *env {
	r.t.Helper()
	return newStacksFor(r, r.s, n, authStyle)
}

// newStacksFor is newStacks with s as the provider of the OAUTH_*
// settings (the connections that name no stored provider), and more
// settings in extra (OAUTH_PROFILE=…). Without a proxy the stacks call
// s's token endpoint itself.
func newStacksFor(r *run, s *server, n int, authStyle string, extra ...string) *env {
	t, db := r.t, r.db
	t.Helper()
	e := &env{t: t, r: r, s: s, db: db}
	tokenURL := s.proxyURL
	if tokenURL == "" {
		tokenURL = s.oauth.Endpoint.TokenURL
	}
	environ := []string{
		"DATABASE_URL=" + db,
		"OAUTH_CLIENT_ID=" + s.oauth.ClientID,
		"OAUTH_CLIENT_SECRET=" + s.oauth.ClientSecret,
		"OAUTH_TOKEN_URL=" + tokenURL,
		"TOKEN_REFRESH_SKEW=" + skew.String(),
		"TOKEN_LOCK_WAIT=4s",
		"TOKEN_REFRESH_TIMEOUT=2s",
		"MIGRATE_ON_START=false",
		"DB_MAX_CONNS=4",
	}
	if authStyle != "" {
		environ = append(environ, "OAUTH_AUTH_STYLE="+authStyle)
	}
	environ = append(environ, extra...)
	cfg, err := di.ConfigFromEnv(environ)
	if err != nil {
		r.fatalf("configuration: %v", err)
	}
	for i := range n {
		buf := &syncBuffer{}
		log := slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelInfo})).With("stack", i)
		m := prometheus.NewRegistry()
		tokens, cleanup, err := di.NewTokens(context.Background(), cfg, log, di.TokenOptions{App: fmt.Sprintf("conformance%d", i), Registry: m})
		if err != nil {
			r.fatalf("stack %d: %v", i, err)
		}
		t.Cleanup(cleanup)
		api, err := apiclient.New(s.api, tokens.Guard, apiclient.Options{Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		e.stacks = append(e.stacks, &stack{tokens: tokens, metrics: m, api: api, log: buf})
	}
	t.Cleanup(func() {
		if t.Failed() {
			for i, st := range e.stacks {
				t.Logf("stack %d log (last lines):\n%s", i, st.log.tail(30))
			}
		}
	})
	if s.startupCheck {
		// What each app does at start-up (di's checkAtStart): the
		// answer to a made-up refresh token, kept as evidence.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		oc := di.OAuth2Config(cfg.OAuth)
		res := provider.Check(ctx, oc, provider.NewHTTPClient(5*time.Second))
		if err := provider.RecordCheck(ctx, repository.NewRefusalEvidence(e.stacks[0].tokens.DB), oc, res); err != nil {
			r.fatalf("keep the start-up check's answer: %v", err)
		}
	}
	// The cache is trusted only once the listener is connected: wait for
	// it, as a process serving traffic would have.
	deadline := time.Now().Add(10 * time.Second)
	for _, st := range e.stacks {
		for gauge(r, st.metrics, "tokenguard_token_listener_connected", nil) != 1 {
			if time.Now().After(deadline) {
				r.fatalf("change listener did not connect within 10s")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return e
}

// connect obtains a first grant from the server (its own authorization
// flow, no tokenguard involved) and stores it as connection name.
func (e *env) connect(name string) domain.Token {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	tok, err := e.s.grant(ctx)
	if err != nil {
		e.r.fatalf("first grant: %v", err)
	}
	if tok.RefreshToken == "" {
		e.r.fatalf("first grant: no refresh token")
	}
	stored, err := e.stacks[0].tokens.Guard.ConnectUseCase().Connect(ctx, name, provider.GrantFrom(tok))
	if err != nil {
		e.r.fatalf("store first grant: %v", err)
	}
	return stored
}

// stored reads the connection's row.
func (e *env) stored(name string) domain.Token {
	e.t.Helper()
	tok, err := e.stacks[0].tokens.Repository.Get(context.Background(), name)
	if err != nil {
		e.r.fatalf("read %s: %v", name, err)
	}
	return tok
}

// dueAt is when the stored token becomes due for refresh.
func (e *env) dueAt(name string) time.Time {
	tok := e.stored(name)
	return tok.Expiry.Add(-tok.EffectiveSkew(skew))
}

// waitDue sleeps until the stored token is due, and a little more.
func (e *env) waitDue(name string) {
	time.Sleep(time.Until(e.dueAt(name)) + 20*time.Millisecond)
}

// counter sums a counter over the stacks, restricted to labels.
func (e *env) counter(name string, labels map[string]string) float64 {
	var sum float64
	for _, st := range e.stacks {
		sum += gauge(e.r, st.metrics, name, labels)
	}
	return sum
}

// gauge reads the sum of a metric's series that carry labels.
func gauge(r *run, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	r.t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		r.fatalf("metrics: %v", err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for k, v := range labels {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == k && lp.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue series
				}
			}
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// call makes one API call through the app's client and returns its
// status, or the error.
func (st *stack) call(ctx context.Context, name string) (int, error) {
	resp, err := st.api.Get(ctx, name, "/resource")
	if err != nil {
		return 0, err
	}
	return resp.StatusCode, nil
}

// status calls the API with a given access token, bypassing tokenguard.
func status(r *run, api, accessToken string) int {
	r.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, api+"/resource", nil)
	req.Header.Set("Authorization", "Bearer "+accessToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.fatalf("API: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// tail returns the last n lines.
func (b *syncBuffer) tail(n int) string {
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
