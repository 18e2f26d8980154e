package e2e

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokenguard/tokenguard/tools/internal/demo"
)

// polyglotSummary is the JSON line a polyglot process prints at its end.
type polyglotSummary struct {
	DirectOK      int64    `json:"direct_ok"`
	ProxiedOK     int64    `json:"proxied_ok"`
	Failed        int64    `json:"failed"`
	Recovered401  int64    `json:"recovered_401"`
	Errors        []string `json:"errors"`
	SelfRefreshed bool     `json:"self_refreshed"`
}

var polyglotDir = filepath.Join("testdata", "polyglot")

// polyglot starts a Python or Node process of testdata/polyglot on the
// stack for d; wait returns its summary.
func (s *stack) polyglot(interp, script string, d time.Duration, extra ...string) (wait func() polyglotSummary) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d+time.Minute)
	cmd := exec.CommandContext(ctx, interp, script)
	cmd.Dir = polyglotDir
	cmd.Env = append(baseEnv(), append([]string{
		"PYTHONPATH=" + filepath.Join("..", "..", "..", "..", "..", "clients", "python"),
		"TOKENGUARD_URL=http://" + s.addr, "TOKENGUARD_API_KEY=" + s.key, "SANDBOX_URL=" + s.sb.URL,
		"CONNECTION=acme", "DURATION=" + strings.TrimSuffix(d.String(), "s"),
	}, extra...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out := make(chan []byte, 1)
	errc := make(chan error, 1)
	go func() {
		b, err := cmd.Output()
		out <- b
		errc <- err
	}()
	return func() polyglotSummary {
		s.t.Helper()
		defer cancel()
		b, err := <-out, <-errc
		var sum polyglotSummary
		if err != nil || json.Unmarshal(b, &sum) != nil {
			s.t.Fatalf("%s %s: %v\nstdout: %s\nstderr: %s", filepath.Base(interp), script, err, b, tail(stderr.String(), 3000))
		}
		s.t.Logf("%s %s: %+v", filepath.Base(interp), script, sum)
		return sum
	}
}

// testPolyglot: the Go server and worker, a Python batch on
// clients/python and a Node process on clients/typescript call one
// connection through expiries of 3 s tokens, each process in a storm of
// concurrent calls at every expiry: one refresh per expiry, no reuse at
// the provider, no failed call anywhere.
func testPolyglot(t *testing.T, bin string) {
	python, node := interpreter(t, "python3"), interpreter(t, "node")
	s := newStack(t, bin, stackOpts{lifetime: lifetime, skew: skew})
	s.migrate()
	granted := s.importGrant("acme")
	server := s.start("server")
	s.waitHealthy(server)
	worker := s.start("worker")
	loadStart := time.Now()
	d := startDriver(s, "acme", 2, 100*time.Millisecond)
	const load = 10 * time.Second
	py := s.polyglot(python, "batch.py", load, "THREADS=4")
	js := s.polyglot(node, "caller.mjs", load, "CONCURRENCY=8")
	pySum, jsSum := py(), js()
	d.finish()
	loadEnd := time.Now()
	waitEvents(t, s.dbURL, d.eventIDs(), 20*time.Second)
	s.stop(worker)
	s.stop(server)

	d.check()
	st := s.sb.Stats()
	for name, sum := range map[string]polyglotSummary{"python": pySum, "node": jsSum} {
		if sum.Failed != 0 || sum.DirectOK == 0 || sum.ProxiedOK == 0 {
			t.Errorf("%s: %d failed calls (%q), %d direct and %d proxied calls, want no failure and both kinds",
				name, sum.Failed, sum.Errors, sum.DirectOK, sum.ProxiedOK)
		}
		if got := st.ResourceByAgent["polyglot-"+name]; got != sum.DirectOK {
			t.Errorf("the provider accepted %d calls of the %s process, which counted %d", got, name, sum.DirectOK)
		}
	}
	if st.RefreshReuse != 0 {
		t.Errorf("refresh-token reuse at the provider: %d", st.RefreshReuse)
	}
	expected := demo.ExpectedRefreshes(granted, loadStart, loadEnd, lifetime-skew)
	if diff := st.Refreshes - int64(expected); diff < -1 || diff > 1 {
		t.Errorf("refreshes = %d, want one per expiry: %d ±1", st.Refreshes, expected)
	}
	t.Logf("provider: %d refreshes (%d expected), %d reuse, %d calls accepted by agent %v, %d answered 401",
		st.Refreshes, expected, st.RefreshReuse, st.ResourceOK, st.ResourceByAgent, st.Resource401)
}

// testPolyglotControl: the same fleet, but the Python batch refreshes the
// connection by itself with the stored refresh token instead of asking
// tokenguard. The provider sees the reuse, and the grant dies for every
// process.
func testPolyglotControl(t *testing.T, bin string) {
	python := interpreter(t, "python3")
	s := newStack(t, bin, stackOpts{lifetime: lifetime, skew: skew})
	s.migrate()
	s.importGrant("acme")
	server := s.start("server")
	s.waitHealthy(server)
	d := startDriver(s, "acme", 2, 100*time.Millisecond)
	cfg := s.sb.OAuth2Config(s.sb.URL)
	py := s.polyglot(python, "batch.py", 5*time.Second, "MODE=self-refresh", "REFRESH_TOKEN="+storedRefreshToken(t, s.dbURL, "acme"),
		"TOKEN_URL="+cfg.Endpoint.TokenURL, "CLIENT_ID="+cfg.ClientID, "CLIENT_SECRET="+cfg.ClientSecret)
	sum := py()
	d.finish()
	s.stop(server)

	st := s.sb.Stats()
	_, status := storedVersionStatus(t, s.dbURL, "acme")
	// Whichever of the two refreshers came second presented a spent
	// refresh token; the provider revoked the grant (RFC 9700 §4.14.2).
	if st.RefreshReuse == 0 || status != "needs_reauth" || d.bad.Load() == 0 {
		t.Errorf("a second refresher of the grant (the Python process refreshed first: %t): provider reuse %d, connection %s, "+
			"%d failed server calls; want the reuse seen and the grant dead for everyone", sum.SelfRefreshed, st.RefreshReuse, status, d.bad.Load())
	}
	t.Logf("control: provider reuse %d, connection %s, server calls %d ok / %d failed", st.RefreshReuse, status, d.ok.Load(), d.bad.Load())
}

// storedRefreshToken reads a connection's refresh token from the database
// (stored in plaintext: the stack sets no TOKEN_ENCRYPTION_KEYS).
func storedRefreshToken(t *testing.T, dbURL, conn string) string {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var rt string
	if err := c.QueryRow(ctx, `SELECT t.refresh_token FROM tokenguard_tokens t JOIN tokenguard_connections c ON c.id = t.connection_id WHERE c.name = $1`, conn).Scan(&rt); err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(rt, "tg1:") {
		t.Fatal("the stored refresh token is encrypted; the control needs it in plaintext")
	}
	return rt
}
