package bench_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/oauth2"

	tokenguard "github.com/tokenguard/tokenguard"
	"github.com/tokenguard/tokenguard/infra/postgres"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/testdb"
	"github.com/tokenguard/tokenguard/internal/testworld"
	"github.com/tokenguard/tokenguard/usecase"
)

// The token budget's fleet (docs/benchmarks.md, "A token budget shared by
// the fleet"): conns connections whose tokens all turn stale at once,
// still valid for budgetValidFor, called by procs OS processes (this test
// binary again, TestBudgetChild) through the public API, at a sandbox that
// answers 429 to token requests beyond sandboxRate a second. With a
// budget (WithTokenRate) the processes share it through Postgres; without
// (the control) each refreshes as soon as it finds a stale token.

// budgetValidFor is how long the stale tokens stay valid: longer than
// refreshing them all at the budget takes, so that every call should be
// served.
const budgetValidFor = 40 * time.Second

// budgetSkew makes a token stale budgetSkew before it expires.
const budgetSkew = time.Minute

// budgetChildEnv carries a child's budgetChild, as JSON.
const budgetChildEnv = "TOKENGUARD_BUDGET_CHILD"

// budgetChild is what a child process of the fleet is told.
type budgetChild struct {
	DB       string
	TokenURL string
	ClientID string
	Secret   string
	Rate     string // WithTokenRate; "" is none
	Conns    []string
	Workers  int
	Pause    time.Duration // between one worker's calls
}

// budgetCalls is what a child reports when its stdin closes.
type budgetCalls struct {
	Calls, Failed int
	FirstError    string
	ErrorLines    int // logged at ERROR
}

// countingHandler counts the records it passes on.
type countingHandler struct {
	slog.Handler
	n *atomic.Int64
}

func (h countingHandler) Handle(ctx context.Context, r slog.Record) error {
	h.n.Add(1)
	return h.Handler.Handle(ctx, r)
}

func (h countingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return countingHandler{h.Handler.WithAttrs(as), h.n}
}

func (h countingHandler) WithGroup(name string) slog.Handler {
	return countingHandler{h.Handler.WithGroup(name), h.n}
}

// budgetRun is what one run of the fleet measured.
type budgetRun struct {
	Refusals   int64         // 429s the sandbox answered
	Calls      int           // Token calls, every process
	Failed     int           // of them failed (every token was still valid)
	FirstErr   string        // the first failure, as a child saw it
	ErrorLines int           // logged at ERROR by the processes
	Refreshed  int           // connections refreshed by the end
	AllIn      time.Duration // from the tokens turning stale until the last was refreshed (0: not all)
	MaxWindow  int           // the most token requests that arrived at the sandbox in any window of the period
	First      time.Duration // from the tokens turning stale until the sandbox's first refresh
	PerSecond  []int         // the sandbox's refreshes in each second from then
}

// TestBudgetChild is a process of the fleet: it does nothing unless run
// as one (budgetChildEnv set). It opens the deployment's database with
// the public API, says READY, and on a line from stdin calls Token for its
// connections from Workers goroutines until stdin closes; then it prints
// its budgetCalls.
func TestBudgetChild(t *testing.T) {
	spec := os.Getenv(budgetChildEnv)
	if spec == "" {
		t.Skip("a process of the token budget's fleet, run by its benchmark and test")
	}
	var c budgetChild
	if err := json.Unmarshal([]byte(spec), &c); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db, err := postgres.Open(ctx, c.DB, postgres.Pool{MaxOpenConns: 4}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = postgres.Close(db) }()
	var errorLines atomic.Int64
	opts := []tokenguard.Option{tokenguard.WithSkew(budgetSkew), tokenguard.WithLockWait(15 * time.Second),
		tokenguard.WithLogger(slog.New(countingHandler{slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}), &errorLines}))}
	if c.Rate != "" {
		opts = append(opts, tokenguard.WithTokenRate(c.Rate))
	}
	cfg := &oauth2.Config{ClientID: c.ClientID, ClientSecret: c.Secret, Endpoint: oauth2.Endpoint{TokenURL: c.TokenURL}}
	tg, err := tokenguard.New(db, cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = tg.Run(ctx) }()
	in := bufio.NewReader(os.Stdin)
	fmt.Println("READY")
	if _, err := in.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	var (
		stop          atomic.Bool
		calls, failed atomic.Int64
		firstErr      sync.Once
		first         string
		wg            sync.WaitGroup
	)
	for range c.Workers {
		wg.Go(func() {
			for !stop.Load() {
				for _, i := range rand.Perm(len(c.Conns)) {
					if stop.Load() {
						return
					}
					cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
					_, err := tg.Token(cctx, c.Conns[i])
					cancel()
					calls.Add(1)
					if err != nil {
						failed.Add(1)
						firstErr.Do(func() { first = err.Error() })
					}
					time.Sleep(c.Pause)
				}
			}
		})
	}
	_, _ = io.Copy(io.Discard, in) // until the parent closes stdin
	stop.Store(true)
	wg.Wait()
	out, _ := json.Marshal(budgetCalls{Calls: int(calls.Load()), Failed: int(failed.Load()), FirstError: first, ErrorLines: int(errorLines.Load())})
	fmt.Println("RESULT " + string(out))
}

// budgetFleet is the world the fleet runs in: a sandbox and a database
// with conns connections granted there.
type budgetFleet struct {
	w        *testworld.World
	conns    []string
	mu       sync.Mutex
	arrivals []time.Time // of every token request, in order
}

func newBudgetFleet(tb testing.TB, conns int) *budgetFleet {
	tb.Helper()
	p, err := sandbox.New(sandbox.Options{AccessTokenLifespan: time.Hour})
	if err != nil {
		tb.Fatal(err)
	}
	f := &budgetFleet{}
	// The sandbox served behind a recorder of when each token request
	// arrives: what its limiter counts.
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/token") {
			f.mu.Lock()
			f.arrivals = append(f.arrivals, time.Now())
			f.mu.Unlock()
		}
		p.Handler().ServeHTTP(rw, r)
	}))
	tb.Cleanup(srv.Close)
	f.w = &testworld.World{URL: testdb.New(tb), Provider: p, Server: srv, OAuth: p.OAuth2Config(srv.URL)}
	s := f.w.Stack(tb, usecase.Options{})
	f.conns = f.w.ConnectMany(tb, s, conns)
	return f
}

// arrivedSince is when the token requests that arrived since t0 did.
func (f *budgetFleet) arrivedSince(t0 time.Time) []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []time.Time
	for _, at := range f.arrivals {
		if !at.Before(t0) {
			out = append(out, at)
		}
	}
	return out
}

// run starts procs processes (rate: their WithTokenRate, "" none), lets
// the sandbox answer 429 beyond sandboxRate token requests a second,
// turns every token stale at once and waits until all are refreshed or
// limit passes. window is the period the sandbox's refreshes are counted
// in (MaxWindow).
func (f *budgetFleet) run(tb testing.TB, procs int, rate string, sandboxRate int, window, limit time.Duration) budgetRun {
	tb.Helper()
	ctx := context.Background()
	db, err := postgres.Open(ctx, f.w.URL, postgres.Pool{MaxOpenConns: 2}, nil)
	if err != nil {
		tb.Fatal(err)
	}
	defer func() { _ = postgres.Close(db) }()
	// Stale (within the skew) and still valid for budgetValidFor; the
	// lifetime granted long, so that the skew is not capped by it.
	if err := db.Exec(`UPDATE tokenguard_tokens SET expiry = now() + ? * interval '1 millisecond', obtained_at = now() - interval '1 hour'`,
		budgetValidFor.Milliseconds()).Error; err != nil {
		tb.Fatal(err)
	}
	if err := db.Exec(`DELETE FROM tokenguard_token_budgets`).Error; err != nil {
		tb.Fatal(err)
	}
	var before int64
	if err := db.Raw(`SELECT coalesce(max(version), 0) FROM tokenguard_tokens`).Scan(&before).Error; err != nil {
		tb.Fatal(err)
	}
	type child struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		out   *bufio.Scanner
	}
	children := make([]child, procs)
	for i := range children {
		spec, _ := json.Marshal(budgetChild{DB: f.w.URL, TokenURL: f.w.OAuth.Endpoint.TokenURL, ClientID: f.w.OAuth.ClientID,
			Secret: f.w.OAuth.ClientSecret, Rate: rate, Conns: f.conns, Workers: 4, Pause: 20 * time.Millisecond})
		cmd := exec.Command(os.Args[0], "-test.run=^TestBudgetChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), budgetChildEnv+"="+string(spec))
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			tb.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			tb.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		children[i] = child{cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout)}
	}
	for i, c := range children {
		if !scanTo(c.out, "READY") {
			tb.Fatalf("process %d of the fleet did not start", i)
		}
	}
	f.w.Provider.SetTokenRate(sandboxRate)
	defer f.w.Provider.SetTokenRate(0)
	f.w.Provider.ResetStats()
	t0 := time.Now()
	for _, c := range children {
		_, _ = io.WriteString(c.stdin, "go\n")
	}
	var res budgetRun
	for time.Since(t0) < limit {
		var n int
		if err := db.Raw(`SELECT count(*) FROM tokenguard_tokens WHERE version > ?`, before).Scan(&n).Error; err != nil {
			tb.Fatal(err)
		}
		res.Refreshed = n
		if n == len(f.conns) {
			res.AllIn = time.Since(t0)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // the callers go on meeting the refreshed tokens
	for i, c := range children {
		_ = c.stdin.Close()
		var calls budgetCalls
		for c.out.Scan() {
			if line, ok := strings.CutPrefix(c.out.Text(), "RESULT "); ok {
				_ = json.Unmarshal([]byte(line), &calls)
			}
		}
		if err := c.cmd.Wait(); err != nil {
			tb.Fatalf("process %d of the fleet: %v", i, err)
		}
		res.Calls += calls.Calls
		res.Failed += calls.Failed
		res.ErrorLines += calls.ErrorLines
		if res.FirstErr == "" {
			res.FirstErr = calls.FirstError
		}
	}
	res.Refusals = f.w.Provider.Stats().RateLimited
	recs := f.w.Provider.Timeline().Refreshes
	res.MaxWindow = maxInWindow(f.arrivedSince(t0), window)
	if len(recs) > 0 {
		res.First = recs[0].At.Sub(t0)
		for _, r := range recs {
			s := int(r.At.Sub(recs[0].At) / time.Second)
			for len(res.PerSecond) <= s {
				res.PerSecond = append(res.PerSecond, 0)
			}
			res.PerSecond[s]++
		}
	}
	return res
}

// scanTo reads lines until want; false when the output ends first.
func scanTo(s *bufio.Scanner, want string) bool {
	for s.Scan() {
		if s.Text() == want {
			return true
		}
	}
	return false
}

// maxInWindow is the most of at in any window [t, t+window).
func maxInWindow(at []time.Time, window time.Duration) int {
	slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
	most, j := 0, 0
	for i := range at {
		for at[i].Sub(at[j]) >= window {
			j++
		}
		most = max(most, i-j+1)
	}
	return most
}

// Three processes sharing a budget of 10/1s keep within the sandbox's
// limit of 10 token requests a second (a token bucket of 10, as
// providers' limits commonly are): it refuses none of them; every call is
// served meanwhile and every token refreshed. Without the budget (the
// control) the same fleet gets 429s from the same sandbox. The most
// requests that arrived in any second is reported, not judged: arrivals
// carry the transit's jitter, which under -race on a loaded machine
// exceeds the margin the budget keeps for it (a twentieth of the period).
func TestTokenBudgetFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("three processes of the fleet")
	}
	const conns, rate = 60, 10
	f := newBudgetFleet(t, conns)
	got := f.run(t, 3, "10/1s", rate, time.Second, 30*time.Second)
	t.Logf("budget 10/1s: %+v", got)
	if got.Refusals != 0 || got.Failed != 0 || got.Refreshed != conns || got.Calls == 0 || got.ErrorLines != 0 {
		t.Errorf("with the budget: %d refusals (at most %d token requests arrived in a second; budget %d), %d of %d calls failed (%s), %d of %d refreshed, %d ERROR lines",
			got.Refusals, got.MaxWindow, rate, got.Failed, got.Calls, got.FirstErr, got.Refreshed, conns, got.ErrorLines)
	}
	control := f.run(t, 3, "", rate, time.Second, 30*time.Second)
	t.Logf("control, no budget: %+v", control)
	if control.Refusals == 0 {
		t.Errorf("control: the sandbox refused nothing (%d token requests at most in a second): the fleet cannot show the budget's effect", control.MaxWindow)
	}
}

// BenchmarkTokenBudget: 300 connections turn stale at once (still valid
// for 40 s), three processes call for them, at a sandbox that answers 429
// to anything over 20 token requests a second, with a budget of 20/1s:
// no refusal, no failed call, all refreshed within 15 s (300 / 20) + 10 %.
// The control, the same without the budget, is run beside it and must
// get refusals. Each op is one expiry of each.
func BenchmarkTokenBudget(b *testing.B) {
	quiet(b)
	const (
		conns = 300
		rate  = 20
	)
	floor := time.Duration(conns/rate) * time.Second
	f := newBudgetFleet(b, conns)
	var with, control []budgetRun
	b.ResetTimer()
	for range b.N {
		with = append(with, f.run(b, 3, "20/1s", rate, time.Second, 2*floor))
		control = append(control, f.run(b, 3, "", rate, time.Second, 2*floor))
	}
	b.StopTimer()
	var refusals, failed, controlRefusals, controlFailed int64
	var seconds []float64
	var window int
	for i := range with {
		b.Logf("budget 20/1s: %+v; control: %+v", with[i], control[i])
		refusals += with[i].Refusals
		failed += int64(with[i].Failed)
		controlRefusals += control[i].Refusals
		controlFailed += int64(control[i].Failed)
		s := with[i].AllIn.Seconds()
		if with[i].AllIn == 0 {
			s = 2 * floor.Seconds() // not all refreshed: as missed as it gets
		}
		seconds = append(seconds, s)
		window = max(window, with[i].MaxWindow)
	}
	n := float64(b.N)
	b.ReportMetric(float64(refusals)/n, "refusals/op")
	b.ReportMetric(float64(failed)/n, "failed/op")
	b.ReportMetric(medianOf(seconds), "seconds-to-refresh-all")
	b.ReportMetric(floor.Seconds(), "target-seconds")
	b.ReportMetric(float64(window), "max-requests-in-a-second")
	b.ReportMetric(float64(controlRefusals)/n, "control-refusals/op")
	b.ReportMetric(float64(controlFailed)/n, "control-failed/op")
	if refusals != 0 || failed != 0 || medianOf(seconds) > 1.1*floor.Seconds() || controlRefusals == 0 {
		b.Errorf("budget 20/1s: %d refusals, %d failed calls, all refreshed in %.1f s (target %.1f s + 10%%); control: %d refusals",
			refusals, failed, medianOf(seconds), floor.Seconds(), controlRefusals)
	}
}
