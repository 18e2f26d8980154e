package conformance_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/testdb"
	"github.com/tokenguard/tokenguard/tools/internal/conformance"
)

func TestMain(m *testing.M) {
	// The zitadel example OP logs every HTTP request through slog's
	// default logger; the stacks log through their own.
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	testdb.Main(m)
}

// Scenario names, the matrix's columns.
const (
	scStorm         = "storm at expiry (3 stacks)"
	sc401           = "401 after another process's refresh"
	scInvalidGrant  = "invalid_grant"
	scInvalidClient = "invalid_client window"
	scClientAuto    = "invalid_client window, defaults"
	scUnavailable   = "transient 503 window"
	scAutoStyle     = "auth style auto-detected (defaults)"
	scTwoProviders  = "two providers, one use case (stored provider + OAUTH_*)"
	scControl       = "control: stale refresh token presented again"
)

type scenario struct {
	name string
	run  func(r *run) conformance.Cell
}

var scenarios = []scenario{
	{scStorm, stormAtExpiry},
	{sc401, unauthorizedAfterOtherRefresh},
	{scInvalidGrant, invalidGrant},
	{scInvalidClient, func(r *run) conformance.Cell { return invalidClientWindow(r, r.s.style) }},
	{scUnavailable, unavailableWindow},
	{scAutoStyle, autoAuthStyle},
	// The same window with OAUTH_AUTH_STYLE at its default: the rejected
	// probe must not teach the stacks a wrong style.
	{scClientAuto, func(r *run) conformance.Cell { return invalidClientWindow(r, "") }},
	{scTwoProviders, twoProviders},
	{scControl, staleCopyControl},
}

// TestConformance runs every scenario against every server and prints the
// matrix (and writes it to CONFORMANCE_MATRIX_OUT when that is set).
func TestConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres and the servers")
	}
	names := make([]string, len(scenarios))
	for i, sc := range scenarios {
		names[i] = sc.name
	}
	matrix := conformance.NewMatrix(names...)
	t.Cleanup(func() {
		md := matrix.Markdown()
		t.Logf("conformance matrix:\n%s", md)
		if out := os.Getenv("CONFORMANCE_MATRIX_OUT"); out != "" {
			if err := os.WriteFile(out, []byte(md), 0o644); err != nil {
				t.Errorf("write %s: %v", out, err)
			}
		}
	})
	servers := []struct {
		name, title string // subtest name, matrix row
		start       func(*testing.T) *server
	}{
		{"fosite sandbox, Basic only", "fosite sandbox (HTTP Basic only)", func(t *testing.T) *server {
			return fositeServer(t, sandbox.ClientAuthBasic)
		}},
		{"fosite sandbox, form only", "fosite sandbox (form body only)", func(t *testing.T) *server {
			return fositeServer(t, sandbox.ClientAuthPost)
		}},
		{"zitadel OP", "zitadel/oidc v3.52 example OP (in-process; strict rotation)", zitadelServer},
		{"oidc-provider", "oidc-provider 8.8 (node process; rotation on, no grace period offered)", oidcProviderServer},
		{"fosite sandbox, Dex-shaped", "fosite sandbox in Dex's shape (--dex: a dead grant is 400 invalid_request, 3 s reuse interval; no profile)", dexServer},
	}
	for _, sv := range servers {
		matrix.AddProvider(sv.title)
	}
	for _, sv := range servers {
		t.Run(sv.name, func(t *testing.T) {
			// Servers run side by side; their scenarios one after the
			// other (they share the server's proxy).
			t.Parallel()
			started := false
			defer func() {
				if !started {
					for _, sc := range scenarios {
						matrix.Set(sv.title, sc.name, conformance.Cell{Note: "the server did not start (see the test log)"})
					}
				}
			}()
			s := sv.start(t)
			s.name = sv.title
			db := testdb.New(t)
			started = true
			for _, sc := range scenarios {
				t.Run(sc.name, func(t *testing.T) {
					r := &run{t: t, s: s, db: db}
					cell := conformance.Cell{Note: "setup failed"}
					defer func() {
						if t.Failed() {
							cell.Pass = false
							if r.failure != "" {
								cell.Note = r.failure
							}
						}
						matrix.Set(s.name, sc.name, cell)
					}()
					cell = sc.run(r)
					cell.Pass = !t.Failed()
				})
			}
			total := s.ownReuse()
			matrix.SetProviderLog(s.name, fmt.Sprintf("%d in the scenarios, %d in the control (%s)", total-s.controlReuse, s.controlReuse, s.ownSource))
		})
	}
}

// run is one scenario against one server.
type run struct {
	t       *testing.T
	s       *server
	db      string
	mu      sync.Mutex
	failure string // the first failure, for the matrix
}

// failf fails the scenario and keeps the first message for the matrix.
func (r *run) failf(format string, args ...any) {
	r.t.Helper()
	msg := fmt.Sprintf(format, args...)
	r.mu.Lock()
	if r.failure == "" {
		r.failure = msg
	}
	r.mu.Unlock()
	r.t.Error(msg)
}

// fatalf is failf that ends the scenario.
func (r *run) fatalf(format string, args ...any) {
	r.t.Helper()
	r.failf(format, args...)
	r.t.FailNow()
}

// reuse is what counts as refresh-token reuse in a scenario where every
// grant is alive: any invalid_grant the server sent, or the server's own
// count, whichever is larger.
func reuse(c conformance.Counts, own int) int {
	return max(c.InvalidGrant, own)
}

// stormAtExpiry: 3 stacks × 20 goroutines ask for the token the moment it
// is due, twice; each then calls the API with it. Exactly one refresh per
// expiry: each storm refreshes, and no refresh comes before the token it
// replaced was due (a cycle that outlasts a 2 s token on a loaded machine
// meets the next expiry, and refreshes again, rightly). No reuse, every
// call 200.
func stormAtExpiry(r *run) conformance.Cell {
	const name, goroutines, cycles = "storm", 20, 2
	e := newStacks(r, 3, r.s.style)
	e.connect(name)
	mark, own := r.s.proxy.Mark(), r.s.ownReuse()
	perCycle := make([]int, 0, cycles)
	for cycle := 1; cycle <= cycles; cycle++ {
		before := r.s.proxy.Mark()
		e.waitDue(name)
		start := make(chan struct{})
		var wg sync.WaitGroup
		var failed atomic.Int64
		for _, st := range e.stacks {
			for range goroutines {
				wg.Go(func() {
					<-start
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					if _, err := st.tokens.RefreshToken.Token(ctx, name); err != nil {
						failed.Add(1)
						r.failf("cycle %d: Token: %v", cycle, err)
						return
					}
					if code, err := st.call(ctx, name); err != nil || code != http.StatusOK {
						failed.Add(1)
						r.failf("cycle %d: API call answered %d, %v", cycle, code, err)
					}
				})
			}
		}
		close(start)
		wg.Wait()
		c := r.s.proxy.Since(before)
		perCycle = append(perCycle, c.Refreshed)
		if c.Refreshed == 0 {
			r.failf("cycle %d: no refresh of a due token", cycle)
		}
	}
	for _, early := range refreshesBeforeDue(r.s.proxy.Answers(mark), skew) {
		r.failf("%s", early)
	}
	c := r.s.proxy.Since(mark)
	ownDelta := r.s.ownReuse() - own
	if c.InvalidGrant != 0 || ownDelta != 0 || c.Other != 0 || c.InvalidClient != 0 {
		r.failf("token endpoint: %+v, server counted %d reuse", c, ownDelta)
	}
	return conformance.Cell{Refreshes: c.Refreshed, Reuse: reuse(c, ownDelta),
		Note: fmt.Sprintf("%d callers per expiry, refreshes per expiry %v", 3*goroutines, perCycle)}
}

// gate holds the first request until released, like a request in flight
// while another process refreshes, and counts the 401s it sees.
type gate struct {
	base     http.RoundTripper
	entered  chan struct{}
	release  chan struct{}
	once     sync.Once
	statuses []int
	mu       sync.Mutex
}

func (g *gate) RoundTrip(req *http.Request) (*http.Response, error) {
	first := false
	g.once.Do(func() { first = true })
	if first {
		close(g.entered)
		<-g.release
	}
	resp, err := g.base.RoundTrip(req)
	if err == nil {
		g.mu.Lock()
		g.statuses = append(g.statuses, resp.StatusCode)
		g.mu.Unlock()
	}
	return resp, err
}

// unauthorizedAfterOtherRefresh: stack A sends a request with the current
// access token; before it arrives, stack B refreshes the token (as it does
// after a 401 of its own: a forced refresh, so that the old access token is
// far from its expiry and only the refresh can have revoked it). At a
// server that revokes the previous access token on refresh, A's request is
// answered 401, and apiclient.Transport recovers it with one forced
// refresh, which finds B's token stored and calls no server. At a server
// that keeps the previous access token valid until it expires, the request
// succeeds and A forces nothing.
func unauthorizedAfterOtherRefresh(r *run) conformance.Cell {
	const name = "after401"
	e := newStacks(r, 2, r.s.style)
	old := e.connect(name)
	a, b := e.stacks[0], e.stacks[1]
	mark, own := r.s.proxy.Mark(), r.s.ownReuse()

	g := &gate{base: http.DefaultTransport, entered: make(chan struct{}), release: make(chan struct{})}
	// The apps' client (tokenguard.Tokens.Client: apiclient.Transport)
	// over the gate, passed the way x/oauth2 takes a base client.
	client := a.tokens.Guard.Client(context.WithValue(context.Background(), oauth2.HTTPClient, &http.Client{Transport: g}), name)
	result := make(chan error, 1)
	go func() {
		resp, err := client.Get(r.s.api + "/resource")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("answered %d", resp.StatusCode)
			}
		}
		result <- err
	}()
	<-g.entered // A holds the token of version old.Version, in flight

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	next, err := b.tokens.RefreshToken.ForceRefresh(ctx, name, old.Version)
	if err != nil {
		close(g.release)
		<-result
		r.fatalf("stack B: refresh: %v", err)
	}
	if next.Version == old.Version {
		r.failf("stack B did not refresh")
	}
	revoked := status(r, r.s.api, old.AccessToken.Reveal()) == http.StatusUnauthorized
	if left := time.Until(old.Expiry); left < 500*time.Millisecond {
		r.failf("the old access token is %v from its expiry: its 401 would not tell a revocation", left)
	}
	close(g.release)
	if err := <-result; err != nil {
		r.failf("stack A's request: %v", err)
	}
	forced := gauge(r, a.metrics, "tokenguard_token_forced_refresh_requests_total", nil)
	g.mu.Lock()
	statuses := append([]int(nil), g.statuses...)
	g.mu.Unlock()
	c := r.s.proxy.Since(mark)
	ownDelta := r.s.ownReuse() - own
	want401, wantForced := 0, 0.0
	note := "old access token kept valid by the server: no 401, nothing forced"
	if revoked {
		want401, wantForced = 1, 1
		note = "old access token revoked by the refresh: 401 recovered with 1 forced refresh"
	}
	n401 := 0
	for _, s := range statuses {
		if s == http.StatusUnauthorized {
			n401++
		}
	}
	if n401 != want401 || forced != wantForced {
		r.failf("A saw %d × 401 (want %d) and forced %v refreshes (want %v); statuses %v", n401, want401, forced, wantForced, statuses)
	}
	if c.Refreshed != 1 || c.InvalidGrant != 0 || ownDelta != 0 {
		r.failf("token endpoint: %+v, server counted %d reuse; want exactly B's refresh", c, ownDelta)
	}
	return conformance.Cell{Refreshes: c.Refreshed, Reuse: reuse(c, ownDelta), Note: note}
}

// invalidGrant: the grant is revoked at the server; when the token comes
// due, 3 stacks × 5 goroutines ask for it. One request reaches the server
// (invalid_grant), the connection is marked needs_reauth once, every
// caller gets ErrNeedsReauth, and later calls do not reach the server.
func invalidGrant(r *run) conformance.Cell {
	const name, goroutines = "revoked", 5
	e := newStacks(r, 3, r.s.style)
	tok := e.connect(name)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := r.s.revoke(ctx, tok.RefreshToken.Reveal()); err != nil {
		r.fatalf("revoke the grant at the server: %v", err)
	}
	mark, own := r.s.proxy.Mark(), r.s.ownReuse()
	e.waitDue(name)
	storm := func(round int) {
		var wg sync.WaitGroup
		for _, st := range e.stacks {
			for range goroutines {
				wg.Go(func() {
					_, err := st.tokens.RefreshToken.Token(ctx, name)
					if !errors.Is(err, domain.ErrNeedsReauth) {
						r.failf("round %d: Token = %v, want ErrNeedsReauth", round, err)
					}
				})
			}
		}
		wg.Wait()
	}
	storm(1)
	storm(2)
	c := r.s.proxy.Since(mark)
	dead := deadAnswers(r.s, r.s.proxy.Answers(mark))
	marked := e.counter("tokenguard_token_refreshes_total", map[string]string{"outcome": "invalid_grant"})
	if c.Requests != 1 || dead != 1 || marked != 1 {
		r.failf("token endpoint: %+v; needs_reauth outcomes %v; want 1 request answered %s and 1 outcome", c, marked, deadCode(r.s))
	}
	if st := e.stored(name); st.Status != domain.StatusNeedsReauth {
		r.failf("stored status %q, want needs_reauth", st.Status)
	}
	ownDelta := r.s.ownReuse() - own
	if ownDelta != 0 {
		r.failf("server counted %d reuse", ownDelta)
	}
	return conformance.Cell{Refreshes: c.Refreshed, Reuse: ownDelta,
		Note: fmt.Sprintf("needs_reauth once (%d × %s, %d callers)", dead, deadCode(r.s), 2*3*goroutines)}
}

// deadCode is the code s answers a dead refresh token with.
func deadCode(s *server) string {
	if s.deadCode != "" {
		return s.deadCode
	}
	return "invalid_grant"
}

// deadAnswers counts the answers that say a refresh token is dead, in s's
// words.
func deadAnswers(s *server, answers []conformance.Answer) int {
	n := 0
	for _, a := range answers {
		if !a.Injected && a.Error == deadCode(s) {
			n++
		}
	}
	return n
}

// traffic calls the API from every stack every 50 ms until stop, and
// watches the stored row every 50 ms.
type traffic struct {
	calls, failures atomic.Int64
	stop            chan struct{}
	done            sync.WaitGroup
}

func startTraffic(e *env, name string, watch func(domain.Token)) *traffic {
	tr := &traffic{stop: make(chan struct{})}
	for _, st := range e.stacks {
		tr.done.Go(func() {
			for {
				select {
				case <-tr.stop:
					return
				case <-time.After(50 * time.Millisecond):
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				code, err := st.call(ctx, name)
				cancel()
				tr.calls.Add(1)
				if err != nil || code != http.StatusOK {
					tr.failures.Add(1)
				}
			}
		})
	}
	tr.done.Go(func() {
		for {
			select {
			case <-tr.stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			tok, err := e.stacks[0].tokens.Repository.Get(context.Background(), name)
			if err == nil {
				watch(tok)
			}
		}
	})
	return tr
}

func (tr *traffic) halt() {
	close(tr.stop)
	tr.done.Wait()
}

// recovered waits until every stack's call succeeds with a token newer
// than version, and returns how long that took.
func recovered(r *run, e *env, name string, version int64, within time.Duration) (time.Duration, bool) {
	start := time.Now()
	ok := make([]bool, len(e.stacks))
	for time.Since(start) < within {
		all := true
		for i, st := range e.stacks {
			if ok[i] {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			tok, err := st.tokens.RefreshToken.Token(ctx, name)
			if err == nil && tok.Version > version {
				if code, err := st.call(ctx, name); err == nil && code == http.StatusOK {
					ok[i] = true
				}
			}
			cancel()
			all = all && ok[i]
		}
		if all {
			return time.Since(start), true
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.failf("not every stack recovered within %v of the window's end (recovered: %v)", within, ok)
	return time.Since(start), false
}

// window is how long the invalid_client and 503 windows last: they open
// when the token comes due and outlast its expiry.
const window = 3 * time.Second

// recovery bounds the recovery after a window ends.
const recovery = 8 * time.Second

// invalidClientWindow: from the moment the token is due, the server
// rejects the client's credentials for 3 s (the proxy corrupts the
// secret, the server answers invalid_client), while 3 stacks keep calling.
// The connection never changes status, the stored token is not replaced,
// and every stack is refreshed and calling again within seconds of the
// window's end. authStyle "" leaves OAUTH_AUTH_STYLE at its default.
func invalidClientWindow(r *run, authStyle string) conformance.Cell {
	name := "clientwindow" + authStyle
	e := newStacks(r, 3, authStyle)
	tok := e.connect(name)
	mark, own := r.s.proxy.Mark(), r.s.ownReuse()
	var changed atomic.Value
	tr := startTraffic(e, name, func(st domain.Token) {
		if st.Status != domain.StatusActive || st.Version != tok.Version || !st.RefreshToken.Equal(tok.RefreshToken) {
			changed.CompareAndSwap(nil, fmt.Sprintf("status %s, version %d (was %d)", st.Status, st.Version, tok.Version))
		}
	})
	// The window opens just before the token comes due: no refresh
	// happens before it.
	opens := e.dueAt(name).Add(-200 * time.Millisecond)
	time.Sleep(time.Until(opens))
	r.s.proxy.SetMode(conformance.RejectClient)
	time.Sleep(time.Until(opens.Add(window)))
	// Traffic and watching stop before the window closes: what the
	// watcher saw happened inside it.
	tr.halt()
	inWindow := r.s.proxy.Since(mark)
	callsInWindow, failuresInWindow := tr.calls.Load(), tr.failures.Load()
	r.s.proxy.SetMode(conformance.Pass)
	if v := changed.Load(); v != nil {
		r.failf("stored row changed during the window: %s", v)
	}
	took, _ := recovered(r, e, name, tok.Version, recovery)
	if st := e.stored(name); st.Status != domain.StatusActive {
		r.failf("stored status %q after the window, want active", st.Status)
	}
	c := r.s.proxy.Since(mark)
	ownDelta := r.s.ownReuse() - own
	if inWindow.InvalidClient == 0 {
		r.failf("the window was not hit: %+v", inWindow)
	}
	if c.InvalidGrant != 0 || ownDelta != 0 {
		r.failf("token endpoint: %+v, server counted %d reuse", c, ownDelta)
	}
	if e.counter("tokenguard_token_refreshes_total", map[string]string{"outcome": "invalid_grant"}) != 0 {
		r.failf("a stack recorded a needs_reauth outcome")
	}
	return conformance.Cell{Refreshes: c.Refreshed, Reuse: reuse(c, ownDelta),
		Note: fmt.Sprintf("%d × invalid_client in the window, status active throughout, all stacks recovered %.1fs after it; %d of %d calls failed in it",
			inWindow.InvalidClient, took.Seconds(), failuresInWindow, callsInWindow)}
}

// unavailableWindow: from the moment the token is due, the token endpoint
// answers 503 for 3 s while 3 stacks keep calling. The stored token is
// untouched during the window, and every stack is refreshed and calling
// again within seconds of its end.
func unavailableWindow(r *run) conformance.Cell {
	const name = "unavailable"
	e := newStacks(r, 3, r.s.style)
	tok := e.connect(name)
	mark, own := r.s.proxy.Mark(), r.s.ownReuse()
	var changed atomic.Value
	tr := startTraffic(e, name, func(st domain.Token) {
		if st.Status != domain.StatusActive || st.Version != tok.Version || !st.RefreshToken.Equal(tok.RefreshToken) {
			changed.CompareAndSwap(nil, fmt.Sprintf("status %s, version %d (was %d)", st.Status, st.Version, tok.Version))
		}
	})
	// The window opens just before the token comes due: no refresh
	// happens before it.
	opens := e.dueAt(name).Add(-200 * time.Millisecond)
	time.Sleep(time.Until(opens))
	r.s.proxy.SetMode(conformance.Unavailable)
	time.Sleep(time.Until(opens.Add(window)))
	// Traffic and watching stop before the window closes: what the
	// watcher saw happened inside it.
	tr.halt()
	inWindow := r.s.proxy.Since(mark)
	callsInWindow, failuresInWindow := tr.calls.Load(), tr.failures.Load()
	r.s.proxy.SetMode(conformance.Pass)
	if v := changed.Load(); v != nil {
		r.failf("stored token changed during the window: %s", v)
	}
	took, _ := recovered(r, e, name, tok.Version, recovery)
	c := r.s.proxy.Since(mark)
	ownDelta := r.s.ownReuse() - own
	if inWindow.Injected == 0 || inWindow.Requests != inWindow.Injected {
		r.failf("the window was not hit, or let requests through: %+v", inWindow)
	}
	if c.InvalidGrant != 0 || ownDelta != 0 || c.InvalidClient != 0 || c.Other != 0 {
		r.failf("token endpoint: %+v, server counted %d reuse", c, ownDelta)
	}
	return conformance.Cell{Refreshes: c.Refreshed, Reuse: reuse(c, ownDelta),
		Note: fmt.Sprintf("%d × 503 in the window, stored token untouched, all stacks recovered %.1fs after it; %d of %d calls failed in it",
			inWindow.Injected, took.Seconds(), failuresInWindow, callsInWindow)}
}

// autoAuthStyle: 3 stacks with OAUTH_AUTH_STYLE unset (the default), two
// expiries, 3 × 5 callers each. Every refresh succeeds, one per expiry.
// Against a server that refuses HTTP Basic, the first refresh may cost one
// invalid_client (the probe); the style found is remembered, so no stack
// probes again.
func autoAuthStyle(r *run) conformance.Cell {
	const name, goroutines, cycles = "autostyle", 5, 2
	e := newStacks(r, 3, "")
	e.connect(name)
	mark, own := r.s.proxy.Mark(), r.s.ownReuse()
	for cycle := 1; cycle <= cycles; cycle++ {
		before := r.s.proxy.Mark()
		e.waitDue(name)
		var wg sync.WaitGroup
		for _, st := range e.stacks {
			for range goroutines {
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					if code, err := st.call(ctx, name); err != nil || code != http.StatusOK {
						r.failf("cycle %d: API call answered %d, %v", cycle, code, err)
					}
				})
			}
		}
		wg.Wait()
		if c := r.s.proxy.Since(before); c.Refreshed == 0 {
			r.failf("cycle %d: no refresh of a due token (%+v)", cycle, c)
		}
	}
	for _, early := range refreshesBeforeDue(r.s.proxy.Answers(mark), skew) {
		r.failf("%s", early)
	}
	c := r.s.proxy.Since(mark)
	ownDelta := r.s.ownReuse() - own
	probes := 0
	if !r.s.basicOK {
		probes = 1
	}
	if c.InvalidClient > probes || c.InvalidGrant != 0 || ownDelta != 0 || c.Other != 0 {
		r.failf("token endpoint: %+v (at most %d invalid_client allowed), server counted %d reuse", c, probes, ownDelta)
	}
	if st := e.stored(name); st.Status != domain.StatusActive {
		r.failf("stored status %q, want active", st.Status)
	}
	styles := map[string]int{}
	for _, a := range r.s.proxy.Answers(mark) {
		if a.Status == http.StatusOK {
			styles[a.Auth]++
		}
	}
	return conformance.Cell{Refreshes: c.Refreshed, Reuse: reuse(c, ownDelta),
		Note: fmt.Sprintf("%d × invalid_client; accepted requests by client auth %v", c.InvalidClient, styles)}
}

// staleCopyControl shows that the reuse counters can see reuse: a client
// that redeems a refresh token and a second client that still holds the
// same token (what several processes without a shared lock and store
// are) present it one after the other, through the proxy. The server must
// reject the second with invalid_grant and count it as reuse.
func staleCopyControl(r *run) conformance.Cell {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	tok, err := r.s.grant(ctx)
	if err != nil {
		r.fatalf("first grant: %v", err)
	}
	cfg := *r.s.oauth
	cfg.Endpoint.TokenURL = r.s.proxyURL
	mark, own := r.s.proxy.Mark(), r.s.ownReuse()
	first, err := cfg.TokenSource(ctx, &oauth2.Token{RefreshToken: tok.RefreshToken}).Token()
	if err != nil {
		r.fatalf("first client's refresh: %v", err)
	}
	if r.s.reuseWindow > 0 {
		// Within its reuse interval the server answers the same token
		// again, by design: the stale copy is presented after it.
		time.Sleep(r.s.reuseWindow + 500*time.Millisecond)
	}
	_, err = cfg.TokenSource(ctx, &oauth2.Token{RefreshToken: tok.RefreshToken}).Token()
	var re *oauth2.RetrieveError
	if !errors.As(err, &re) || re.ErrorCode != deadCode(r.s) {
		r.failf("second client's refresh with the same token: %v, want %s", err, deadCode(r.s))
	}
	// What the reuse did to the grant: RFC 9700 §4.14.2 says revoke it,
	// so the first client's newer token dies too.
	family := "the grant survives the reuse (the newer refresh token still works)"
	if _, err := cfg.TokenSource(ctx, &oauth2.Token{RefreshToken: first.RefreshToken}).Token(); err != nil {
		family = "the reuse revoked the whole grant (RFC 9700 §4.14.2)"
	}
	// A server's log is read as the process writes it.
	deadline := time.Now().Add(3 * time.Second)
	for r.s.ownReuse() == own && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	ownDelta := r.s.ownReuse() - own
	r.s.controlReuse = ownDelta
	c := r.s.proxy.Answers(mark)
	// The first two answers are the control; the third only probes the
	// grant.
	head := conformance.Count(c[:min(2, len(c))])
	dead := deadAnswers(r.s, c[:min(2, len(c))])
	if head.Refreshed != 1 || dead != 1 || ownDelta != 1 {
		r.failf("token endpoint %+v, server counted %d reuse; want 1 refresh, 1 %s, 1 reuse", head, ownDelta, deadCode(r.s))
	}
	return conformance.Cell{Refreshes: head.Refreshed, Reuse: max(dead, ownDelta),
		Note: fmt.Sprintf("reuse caught: %d × %s at the proxy, %d counted by the server; %s", dead, deadCode(r.s), ownDelta, family)}
}

// refreshesBeforeDue lists the refreshes in answers that reached the
// provider before the token they replaced was due: its expires_in from the
// previous refresh's arrival, less the skew (at most half the lifetime, as
// domain.Token.EffectiveSkew caps it). The client dates a token from its
// answer, later than its request reached the proxy, so the bound errs on
// the client's side; 50 ms covers the clocks of two goroutines.
func refreshesBeforeDue(answers []conformance.Answer, skew time.Duration) []string {
	var granted []conformance.Answer
	for _, a := range answers {
		if a.GrantType == "refresh_token" && a.Status == http.StatusOK {
			granted = append(granted, a)
		}
	}
	slices.SortFunc(granted, func(a, b conformance.Answer) int { return a.At.Compare(b.At) })
	var early []string
	for i := 1; i < len(granted); i++ {
		prev, life := granted[i-1], granted[i-1].ExpiresIn
		due := prev.At.Add(life - min(skew, life/2) - 50*time.Millisecond)
		if granted[i].At.Before(due) {
			early = append(early, fmt.Sprintf("refresh %d reached the provider %v after refresh %d, whose token (expires_in %v) was due after %v",
				i+1, granted[i].At.Sub(prev.At).Round(time.Millisecond), i, life, life-min(skew, life/2)))
		}
	}
	return early
}

func TestRefreshesBeforeDue(t *testing.T) {
	t0 := time.Now()
	refresh := func(at time.Duration) conformance.Answer {
		return conformance.Answer{GrantType: "refresh_token", Status: http.StatusOK, At: t0.Add(at), ExpiresIn: 2 * time.Second}
	}
	refused := conformance.Answer{GrantType: "refresh_token", Status: http.StatusBadRequest, At: t0.Add(1100 * time.Millisecond)}
	// Due 1 s after each refresh: 0, 1.1 s and 2.2 s are each on time,
	// whatever order they were recorded in; a refusal is no refresh.
	if got := refreshesBeforeDue([]conformance.Answer{refresh(2200 * time.Millisecond), refresh(0), refused, refresh(1100 * time.Millisecond)}, time.Second); len(got) != 0 {
		t.Errorf("refreshes on time reported early: %v", got)
	}
	// Two refreshes of one expiry, 0.3 s apart: the second was not due.
	if got := refreshesBeforeDue([]conformance.Answer{refresh(0), refresh(300 * time.Millisecond)}, time.Second); len(got) != 1 {
		t.Errorf("a refresh 0.3 s after a 2 s token was granted: %v, want it reported", got)
	}
}
