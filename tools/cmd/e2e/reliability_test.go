package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/infra/batch"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/waitfor"
	"github.com/tokenguard/tokenguard/tools/internal/demo"
)

// Messages of log lines the use case and the retry decorator write; the
// apps log text or JSON, so only the message is matched.
const (
	markedLine = `connection needs re-authorisation: the provider rejected its grant`
	hookLine   = `operator action needed: connect it again`
	retryLine  = `token refresh failed, retrying`
)

// debugLevel matches a debug line in either log format.
var debugLevel = regexp.MustCompile(`level=DEBUG|"level":"DEBUG"`)

// dumpLogs writes the apps' stderr to $E2E_LOG_DIR/<test>-<app>.log when
// that is set, for looking at a run after the fact.
func dumpLogs(t *testing.T, apps ...*app) {
	dir := os.Getenv("E2E_LOG_DIR")
	if dir == "" {
		return
	}
	name := strings.NewReplacer("/", "-", " ", "_").Replace(t.Name())
	for _, a := range apps {
		_ = os.WriteFile(filepath.Join(dir, name+"-"+a.Name+".log"), []byte(a.Stderr()), 0o644)
	}
}

// schedule is a deterministic fault schedule: the n-th refresh request the
// provider receives gets pattern[n % len(pattern)]. Refreshes of one
// connection are serialised by its lock, so the sequence each refresh sees
// does not depend on which process makes it.
type schedule struct {
	mu      sync.Mutex
	n       int
	pattern []sandbox.Fault
	counts  map[sandbox.Fault]int
	off     atomic.Bool // while set, nothing is injected (and n stands still)
}

func newSchedule(pattern ...sandbox.Fault) *schedule {
	return &schedule{pattern: pattern, counts: map[sandbox.Fault]int{}}
}

func (s *schedule) next() sandbox.Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := sandbox.FaultNone
	if !s.off.Load() {
		f = s.pattern[s.n%len(s.pattern)]
		s.n++
	}
	s.counts[f]++
	return f
}

func (s *schedule) snapshot() map[sandbox.Fault]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[sandbox.Fault]int, len(s.counts))
	for k, v := range s.counts {
		out[k] = v
	}
	return out
}

// appLines counts the lines of the apps' stderr that contain sub.
func appLines(sub string, apps ...*app) (n int, lines []string) {
	for _, a := range apps {
		for l := range strings.SplitSeq(a.Stderr(), "\n") {
			if strings.Contains(l, sub) {
				n++
				lines = append(lines, a.Name+": "+l)
			}
		}
	}
	return n, lines
}

// batchFailures sums the failed calls of the batch's rounds.
func batchFailures(rs []batch.Round) (calls, failed int, errs []string) {
	for _, r := range rs {
		calls += r.Succeeded
		failed += r.Failed + len(r.Errors)
		errs = append(errs, r.Errors...)
	}
	return calls, failed, errs
}

// testProviderFaults runs the three apps through many expiry cycles while
// the provider answers 30% of refresh requests 503, 10% 429 with
// Retry-After and lets 10% hang past the refresh timeout before it answers.
// No app may see a failure, and no refresh token may be presented twice.
func testProviderFaults(t *testing.T, bin string) {
	const (
		lifetime = 8 * time.Second
		// Refresh with 5s left: longer than one refresh may take on a loaded host when the apps'
		// start-up checks interleave with it and it meets a 503, a 429 (Retry-After: 1) and a hang.
		skew     = 5 * time.Second
		duration = 18 * time.Second
		hangFor  = 1800 * time.Millisecond // past TOKEN_REFRESH_TIMEOUT
	)
	U, R, H, N := sandbox.FaultUnavailable, sandbox.FaultTooManyRequests, sandbox.FaultHang, sandbox.FaultNone
	sched := newSchedule(N, U, N, U, R, N, H, N, U, N)
	// A hang outlasts the refresh timeout, then the provider answers (and
	// rotates): its callers are served the still-valid token meanwhile, and
	// the answer is stored. (A hang that is never answered keeps its
	// connection from refreshing until the answer deadline: testFrozenProvider.)
	fault := func() sandbox.Fault {
		if f := sched.next(); f != H {
			return f
		}
		time.Sleep(hangFor)
		return N
	}
	s := newStack(t, bin, stackOpts{lifetime: lifetime, skew: skew, fault: fault, extraEnv: []string{
		// A refresh (retries included) must end before the lock waiters
		// give up, and before the token it replaces expires.
		"TOKEN_LOCK_WAIT=3s", "TOKEN_REFRESH_TIMEOUT=1500ms",
	}})
	s.migrate()
	const conn = "acme"
	s.importGrant(conn)
	server := s.start("server")
	s.waitHealthy(server)
	worker := s.start("worker")
	batchApp := s.start("batch", "--every", "500ms")
	d := startDriver(s, conn, 3, 50*time.Millisecond)
	time.Sleep(duration)
	d.finish()
	ids := d.eventIDs()
	js := waitEvents(t, s.dbURL, ids, 20*time.Second)
	s.stop(batchApp)
	s.stop(worker)
	s.stop(server)
	dumpLogs(t, server, worker, batchApp)
	st := s.sb.Stats()
	injected := sched.snapshot()

	// Failures as the apps saw them.
	rs := rounds(t, batchApp)
	roundCalls, roundFailed, roundErrs := batchFailures(rs)
	var eventsRetried []string
	for _, id := range ids {
		if j, ok := js[id]; !ok || j.State != "completed" || j.Attempt != 1 || j.Errors != 0 {
			eventsRetried = append(eventsRetried, fmt.Sprintf("%d: %+v (present: %t)", id, j, ok))
		}
	}
	retries, _ := appLines(retryLine, server, worker, batchApp)
	t.Logf("injected (by provider request): %v; provider: %d refreshes, %d rejected, %d faults, %d reuse, %d×401",
		injected, st.Refreshes, st.RefreshRejected, st.RefreshFaults, st.RefreshReuse, st.Resource401)
	t.Logf("apps: server %d ok / %d failed; worker %d events, %d not completed at the first attempt; batch %d rounds, %d ok calls, %d failed; %d retry lines",
		d.ok.Load(), d.bad.Load(), len(ids), len(eventsRetried), len(rs), roundCalls, roundFailed, retries)

	d.check()
	if roundFailed > 0 || len(rs) < 10 {
		t.Errorf("batch: %d rounds, %d failures: %q", len(rs), roundFailed, roundErrs)
	}
	if len(eventsRetried) > 0 {
		t.Errorf("%d of %d events not completed at their first attempt, e.g. %s", len(eventsRetried), len(ids), eventsRetried[0])
	}
	if t.Failed() {
		_, errLines := appLines("ERROR", server, worker, batchApp)
		_, warnLines := appLines("WARN", server, worker, batchApp)
		t.Logf("error lines:\n%s\nwarnings:\n%s", strings.Join(errLines, "\n"), tail(strings.Join(warnLines, "\n"), 6000))
	}
	// The run exercised every fault, and each was seen by the provider.
	for _, f := range []sandbox.Fault{U, R, H} {
		if injected[f] == 0 {
			t.Errorf("no %v fault was injected: %v", f, injected)
		}
	}
	if got, want := st.RefreshFaults, int64(injected[U]+injected[R]); got != want {
		t.Errorf("provider counted %d faults, the schedule injected %d (and %d hangs, answered)", got, want, injected[H])
	}
	if st.RefreshReuse != 0 {
		t.Errorf("refresh-token reuse = %d", st.RefreshReuse)
	}
	if st.Refreshes < int64(duration/(lifetime-skew+hangFor)) { // a cycle: until the refresh is due, then its faults
		t.Errorf("only %d refreshes in %v of %v tokens", st.Refreshes, duration, lifetime)
	}
	if v := storedVersion(t, s, conn); v != st.Refreshes+1 {
		t.Errorf("stored version %d after %d refreshes", v, st.Refreshes)
	}
	// Every call the provider accepted is one an app counted.
	want := map[string]int64{"tokenguard-server": d.ok.Load(), "tokenguard-worker": int64(len(ids)), "tokenguard-batch": int64(roundCalls)}
	for agent, n := range want {
		if got := st.ResourceByAgent[agent]; got != n {
			t.Errorf("provider saw %d calls from %s, the app made %d", got, agent, n)
		}
	}
}

// statusLoad calls GET resource (or another route) from several clients
// and tallies the answers by status (0: no answer) and, for errors, by JSON
// code, and the slowest.
type statusLoad struct {
	s    *stack
	conn string
	stop chan struct{}
	wg   sync.WaitGroup

	mu      sync.Mutex
	counts  map[string]int
	firstOK time.Time // first 200 after since
	since   time.Time
	slowest time.Duration
}

func startStatusLoad(s *stack, conn string, clients int) *statusLoad {
	return startLoad(s, conn, "/connections/"+conn+"/resource", clients)
}

func startLoad(s *stack, conn, path string, clients int) *statusLoad {
	l := &statusLoad{s: s, conn: conn, stop: make(chan struct{}), counts: map[string]int{}}
	for range clients {
		l.wg.Go(func() {
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				start := time.Now()
				code, body := s.do(http.MethodGet, path, "")
				at := time.Now()
				key := fmt.Sprint(code)
				if code != http.StatusOK {
					var e struct {
						Code string `json:"code"`
					}
					_ = json.Unmarshal([]byte(body), &e)
					key += " " + e.Code
				}
				l.mu.Lock()
				l.counts[key]++
				l.slowest = max(l.slowest, at.Sub(start))
				if code == http.StatusOK && !l.since.IsZero() && l.firstOK.IsZero() {
					l.firstOK = at
				}
				l.mu.Unlock()
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	return l
}

// reset starts a new tally; firstOK is then the first 200 answered after now.
func (l *statusLoad) reset() map[string]int {
	counts, _ := l.window()
	return counts
}

// window is reset, with the slowest answer of the tally ended.
func (l *statusLoad) window() (map[string]int, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	old, slowest := l.counts, l.slowest
	l.counts, l.since, l.firstOK, l.slowest = map[string]int{}, time.Now(), time.Time{}, 0
	return old, slowest
}

// served says whether a 200 was answered since the tally began.
func (l *statusLoad) served() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.firstOK.IsZero()
}

func (l *statusLoad) finish() map[string]int {
	close(l.stop)
	l.wg.Wait()
	return l.reset()
}

// testRevokedGrantOnce revokes the grant at the provider while the three
// apps use it: the connection is marked needs_reauth exactly once (one
// rejected refresh at the provider, one log line in one process), the
// server answers 409, tokenctl status shows it, and a fresh import makes it
// active again for every app.
func testRevokedGrantOnce(t *testing.T, bin string) {
	s := newStack(t, bin, stackOpts{lifetime: lifetime, skew: skew})
	s.migrate()
	const conn = "acme"
	s.importGrant(conn)
	server := s.start("server")
	s.waitHealthy(server)
	worker := s.start("worker")
	batchApp := s.start("batch", "--every", "300ms")
	load := startStatusLoad(s, conn, 3)
	events := func(n int) ([]int64, map[string]int) { return postEvents(s, conn, n) }
	before, _ := events(20) // ~1s, then one more refresh
	time.Sleep(lifetime - skew)
	if js := waitEvents(t, s.dbURL, before, 15*time.Second); len(js) != len(before) {
		t.Errorf("events before the revocation: %d of %d", len(js), len(before))
	}
	st0 := s.sb.Stats()
	beforeCounts := load.reset()

	// Revoke while server, worker and batch keep using the connection: all
	// three see the 401 of the revoked access token at about the same time.
	s.sb.RevokeAll()
	revokedAt := time.Now()
	during, refused := events(20) // 1s of events for the worker
	time.Sleep(lifetime - skew)   // the revoked tokens would be due by now
	st1 := s.sb.Stats()
	time.Sleep(lifetime - skew) // and another cycle: nobody asks the provider again
	st2 := s.sb.Stats()
	afterCounts := load.reset()
	marks, markLines := appLines(markedLine, server, worker, batchApp)

	if marks != 1 {
		t.Errorf("%d needs-reauth log lines, want exactly 1:\n%s", marks, strings.Join(markLines, "\n"))
	}
	// The apps' OnNeedsReauth hook tells the operator what to do, once.
	if hooks, hookLines := appLines(hookLine, server, worker, batchApp); hooks != 1 {
		t.Errorf("the OnNeedsReauth hook fired %d times, want exactly 1:\n%s", hooks, strings.Join(hookLines, "\n"))
	}
	if n := st1.RefreshRejected - st0.RefreshRejected; n != 1 {
		t.Errorf("%d refresh requests rejected after the revocation, want exactly 1", n)
	}
	if st2.RefreshRejected != st1.RefreshRejected || st2.Refreshes != st0.Refreshes {
		t.Errorf("provider refresh requests kept coming after the mark: rejected %d -> %d, refreshes %d -> %d",
			st1.RefreshRejected, st2.RefreshRejected, st0.Refreshes, st2.Refreshes)
	}
	for k := range afterCounts {
		if k != "200" && k != "409 needs_reauth" {
			t.Errorf("after the revocation the server answered %q %d times; want only 200 (before the mark) or 409 needs_reauth", k, afterCounts[k])
		}
	}
	if afterCounts["409 needs_reauth"] == 0 {
		t.Errorf("server never answered 409 after the revocation: %v", afterCounts)
	}
	expectJSONError(t, s, http.MethodGet, "/connections/"+conn+"/resource", http.StatusConflict, "needs_reauth")
	expectJSONError(t, s, http.MethodPost, "/connections/"+conn+"/events", http.StatusConflict, "needs_reauth", "{}")
	status := run(t, bin, "tokenctl", s.env, "", "status", "--connection", conn)
	if status.code != 0 || !strings.Contains(status.stdout, " needs_reauth ") || !strings.Contains(status.stdout, "invalid_grant") {
		t.Errorf("tokenctl status after the revocation: exit %d\n%s%s", status.code, status.stdout, status.stderr)
	}

	// A fresh import makes it active again, for every app.
	s.sb.ResetStats()
	reimported := time.Now()
	s.importGrant(conn)
	waitfor.Until(t, 5*time.Second, "the server did not use the re-imported grant", func() bool {
		code, _ := s.do(http.MethodGet, "/connections/"+conn+"/resource", "")
		return code == http.StatusOK
	})

	time.Sleep(200 * time.Millisecond) // requests that read the old status are answered
	load.reset()
	after, _ := events(20)
	time.Sleep(lifetime - skew) // a refresh of the new grant is due by now
	js := waitEvents(t, s.dbURL, after, 15*time.Second)
	finalCounts := load.finish()
	s.stop(batchApp)
	s.stop(worker)
	s.stop(server)
	dumpLogs(t, server, worker, batchApp)
	st3 := s.sb.Stats()
	for _, id := range after {
		if j := js[id]; j.State != "completed" {
			t.Errorf("event %d after the re-import: %+v", id, j)
		}
	}
	for k, n := range finalCounts {
		if k != "200" {
			t.Errorf("after the re-import the server answered %q %d times", k, n)
		}
	}
	batchAfter := checkLastRoundsOK(t, rounds(t, batchApp))
	if status := run(t, bin, "tokenctl", s.env, "", "status", "--connection", conn); !strings.Contains(status.stdout, " active ") {
		t.Errorf("tokenctl status after the re-import:\n%s", status.stdout)
	}
	if st3.Refreshes == 0 || st3.RefreshRejected != 0 || st3.RefreshReuse != 0 || st2.RefreshReuse != 0 {
		t.Errorf("provider after the re-import: %+v (before: %+v)", st3, st2)
	}
	t.Logf("before: %v; revoked at +0: server answers %v, events accepted %d refused %v, batch and worker kept running",
		beforeCounts, afterCounts, len(during), refused)
	t.Logf("provider after the revocation: %d rejected (then %d), 0 refreshes; marks: %q", st1.RefreshRejected-st0.RefreshRejected,
		st2.RefreshRejected-st0.RefreshRejected, markLines)
	t.Logf("re-imported %v after the revocation: server %v, %d events completed, batch last rounds ok %d; provider %d refreshes",
		reimported.Sub(revokedAt).Round(time.Millisecond), finalCounts, len(after), batchAfter, st3.Refreshes)
	t.Logf("tokenctl status after the revocation:\n%s", status.stdout)
}

// postEvents posts n events to conn, 50 ms apart; it returns the ids of
// those accepted and the refusals by status and code.
func postEvents(s *stack, conn string, n int) (accepted []int64, refused map[string]int) {
	refused = map[string]int{}
	for i := range n {
		code, body := s.do(http.MethodPost, "/connections/"+conn+"/events", fmt.Sprintf(`{"n":%d}`, i))
		var r struct {
			EventID int64  `json:"event_id"`
			Code    string `json:"code"`
		}
		_ = json.Unmarshal([]byte(body), &r)
		if code == http.StatusAccepted {
			accepted = append(accepted, r.EventID)
		} else {
			refused[fmt.Sprint(code, " ", r.Code)]++
		}
		time.Sleep(50 * time.Millisecond)
	}
	return accepted, refused
}

// checkLastRoundsOK: the batch's last rounds (printed in order, every
// 300ms: they ran on the new grant) succeeded; it returns their calls.
func checkLastRoundsOK(t *testing.T, rs []batch.Round) (succeeded int) {
	t.Helper()
	var failed int
	for _, r := range rs[max(0, len(rs)-5):] {
		succeeded += r.Succeeded
		failed += r.Failed
	}
	if succeeded == 0 || failed > 0 {
		t.Errorf("batch after the re-import: last rounds %+v", rs[max(0, len(rs)-5):])
	}
	return succeeded
}

// secrets collects every token value the sandbox issued, read from its
// token endpoint's responses, and the authorization codes it handed out.
type secrets struct {
	mu     sync.Mutex
	tokens []string // access and refresh tokens
	codes  []string
}

func (c *secrets) add(kind *[]string, v string) {
	if v == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	*kind = append(*kind, v)
}

func (c *secrets) list() (tokens, codes []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.tokens), slices.Clone(c.codes)
}

type recorder struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (r *recorder) WriteHeader(code int) { r.status = code; r.ResponseWriter.WriteHeader(code) }
func (r *recorder) Write(p []byte) (int, error) {
	r.body.Write(p)
	return r.ResponseWriter.Write(p)
}

// tee wraps the sandbox's handler and records what it issues.
func (c *secrets) tee(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &recorder{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(rec, r)
		switch r.URL.Path {
		case "/oauth2/token":
			var tok struct {
				AccessToken  string `json:"access_token"`
				RefreshToken string `json:"refresh_token"`
			}
			if json.Unmarshal(rec.body.Bytes(), &tok) == nil {
				c.add(&c.tokens, tok.AccessToken)
				c.add(&c.tokens, tok.RefreshToken)
			}
		case "/oauth2/auth":
			if loc := rec.Header().Get("Location"); loc != "" {
				if i := strings.Index(loc, "code="); i >= 0 {
					code, _, _ := strings.Cut(loc[i+len("code="):], "&")
					c.add(&c.codes, code)
				}
			}
		}
	})
}

// needles are the strings whose presence means a secret leaked: the value
// itself and each part of an HMAC token (fosite: prefix_key.signature) long
// enough to identify it.
func needles(secret string) []string {
	out := []string{secret}
	for p := range strings.SplitSeq(strings.TrimPrefix(strings.TrimPrefix(strings.TrimPrefix(secret, "ory_at_"), "ory_rt_"), "ory_ac_"), ".") {
		if len(p) >= 16 && p != secret {
			out = append(out, p)
		}
	}
	return out
}

// scan returns the lines of text that contain any of the secrets.
func scan(text string, secrets []string) []string {
	var hits []string
	for l := range strings.SplitSeq(text, "\n") {
		for _, sec := range secrets {
			if slices.ContainsFunc(needles(sec), func(n string) bool { return strings.Contains(l, n) }) {
				hits = append(hits, l)
				break
			}
		}
	}
	return hits
}

// bodyTee records every response body the test's HTTP client receives.
type bodyTee struct {
	host string // only answers from this host are kept
	next http.RoundTripper
	mu   sync.Mutex
	buf  bytes.Buffer
	n    int
}

func (b *bodyTee) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := b.next.RoundTrip(r)
	if r.URL.Host != b.host {
		// The provider's own answers (its redirect to the callback
		// carries the authorization code) are not tokenguard's output.
		return resp, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n++
	if err != nil {
		fmt.Fprintf(&b.buf, "%s %s: error %v\n", r.Method, r.URL.Path, err)
		return resp, err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	// The request's URL is the test's own (the callback's carries a
	// code); only the answer is tokenguard's.
	fmt.Fprintf(&b.buf, "%s %s: %s %v\n%s\n", r.Method, r.URL.Path, resp.Status, resp.Header, body)
	return resp, nil
}

func (b *bodyTee) text() (string, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String(), b.n
}

// testNoTokenLeaks runs the demo's flow with every app at debug level,
// under provider faults and a revocation at the end, and looks for every
// token the sandbox ever issued in every line the apps and tokenctl
// printed and every HTTP answer the test received.
func testNoTokenLeaks(t *testing.T, bin string) {
	var issued secrets
	U, R, N := sandbox.FaultUnavailable, sandbox.FaultTooManyRequests, sandbox.FaultNone
	sched := newSchedule(N, U, N, R, N, N)
	p, err := sandbox.New(sandbox.Options{AccessTokenLifespan: lifetime, RefreshFault: sched.next, RedirectURIs: []string{"*"}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(issued.tee(p.Handler()))
	t.Cleanup(srv.Close)
	const webhookSecret = "whsec-leak-5f1e0c9a7b3d2e4f6a8b"
	rcv := newReceiver(t, webhookSecret)
	s := newStack(t, bin, stackOpts{lifetime: lifetime, skew: skew, extraEnv: []string{"LOG_LEVEL=debug",
		"WEBHOOK_URL=" + rcv.url(), "WEBHOOK_SECRET=" + webhookSecret}})
	// The stack's own sandbox stays idle: the apps talk to the tee'd one.
	for i, e := range s.env {
		s.env[i] = strings.ReplaceAll(e, s.sb.URL, srv.URL)
	}
	s.sb = &demo.Sandbox{Provider: p, URL: srv.URL}
	bodies := &bodyTee{host: s.addr, next: s.client.Transport}
	s.client.Transport = bodies
	var printed []string // what short-lived commands printed
	runAndKeep := func(name string, stdin string, args ...string) result {
		r := run(t, bin, name, s.env, stdin, args...)
		printed = append(printed, fmt.Sprintf("%s %v (exit %d):\n%s%s", name, args, r.code, r.stdout, r.stderr))
		return r
	}

	// Scanner self-test: it must see a token, and a token's signature alone.
	s.migrate()
	s.importGrant("acme")
	tokens, _ := issued.list()
	if len(tokens) != 2 {
		t.Fatalf("the tee saw %d tokens from the first grant, want 2", len(tokens))
	}
	checkScannerSeesTokens(t, tokens)

	server := s.start("server")
	s.waitHealthy(server)
	worker := s.start("worker")
	batchApp := s.start("batch", "--every", "400ms", "--refresh-ahead", "2s")
	// A second connection through the browser flow, with the test's
	// recording client.
	browser := personAt(s, "", "")
	browser.Transport = bodies
	// Credentials of tokenguard's own: the API key, the webhook secret and
	// every connect session token handed out (used, replayed, or never used).
	credentials := append([]string{s.key, strings.TrimPrefix(s.key, "tgk_"), webhookSecret}, connectThroughBrowser(t, s, browser)...)
	d := startDriver(s, "acme", 2, 100*time.Millisecond)
	d2 := startDriver(s, "beta", 1, 200*time.Millisecond)
	time.Sleep(6 * time.Second)
	// The end of the demo: the provider revokes everything.
	p.RevokeAll()
	time.Sleep(lifetime)
	d.finish()
	d2.finish()
	for _, c := range []string{"acme", "beta"} {
		s.do(http.MethodGet, "/connections/"+c+"/resource", "")
		s.do(http.MethodPost, "/connections/"+c+"/events", `{"n":-1}`)
	}
	runAndKeep("tokenctl", "", "status")
	runAndKeep("tokenctl", "", "apikey", "list")
	runAndKeep("batch", "")
	waitfor.Until(t, 30*time.Second, "webhooks for the grants and the revocation", func() bool {
		ev, _, _ := rcv.snapshot()
		return len(ev) >= 4
	})

	// Bad input that carries a live token must not echo it either.
	runAndKeep("tokenctl", `{"access_token":"`+tokens[0]+`","token_type":"Bearer","refresh_token":`, "import", "--connection", "acme")
	s.stop(batchApp)
	s.stop(worker)
	s.stop(server)
	dumpLogs(t, server, worker, batchApp)
	st := p.Stats()

	tokens, codes := issued.list()
	if want := 2 * (st.CodeExchanges + st.Refreshes); int64(len(tokens)) != want {
		t.Errorf("the tee saw %d tokens; the provider issued %d (%d grants, %d refreshes)", len(tokens), want, st.CodeExchanges, st.Refreshes)
	}
	if st.Refreshes < 6 || st.RefreshFaults == 0 || st.RefreshRejected <= st.RefreshFaults {
		t.Errorf("the run did not go through the flow: %+v", st)
	}
	httpText, responses := bodies.text()
	rcv.mu.Lock()
	webhookText := strings.Join(rcv.bodies, "\n")
	rcv.mu.Unlock()
	outputs := map[string]string{"HTTP answers to the test": httpText, "tokenctl and batch runs": strings.Join(printed, "\n"),
		"webhook requests": webhookText}
	for _, a := range []*app{server, worker, batchApp} {
		a.mu.Lock()
		outputs[a.Name+" stdout"] = strings.Join(a.lines, "\n")
		a.mu.Unlock()
		outputs[a.Name+" stderr"] = a.Stderr()
	}
	debug, total := scanOutputs(t, outputs, tokens, codes, credentials, s.sb.OAuth2Config("").ClientSecret)
	if debug == 0 {
		t.Error("no debug line at all: the apps did not log at debug level")
	}
	t.Logf("scanned %d lines (%d at debug level), %d HTTP answers and the webhook requests for %d tokens, %d codes and %d API key, session and webhook secret needles; provider: %d grants, %d refreshes, %d faults, %d rejected, %d reuse",
		total, debug, responses, len(tokens), len(codes), len(credentials), st.CodeExchanges, st.Refreshes, st.RefreshFaults, st.RefreshRejected, st.RefreshReuse)
}

// checkScannerSeesTokens is the scanner's self-test: it sees a token, and
// a token's signature alone, and nothing in a line without one.
func checkScannerSeesTokens(t *testing.T, tokens []string) {
	t.Helper()
	_, sig, _ := strings.Cut(tokens[1], ".")
	for _, line := range []string{
		`time=x level=DEBUG msg=refreshed token="` + tokens[0] + `"`,
		"Authorization: Bearer " + tokens[0],
		`{"refresh":"` + sig + `"}`,
	} {
		if hits := scan("noise\n"+line+"\nnoise", tokens); len(hits) != 1 {
			t.Fatalf("scanner self-test: %d hits in %q, want 1", len(hits), line)
		}
	}
	if hits := scan("level=INFO msg=ok connection=acme version=2", tokens); len(hits) != 0 {
		t.Fatalf("scanner self-test: false positive %q", hits)
	}
}

// connectThroughBrowser connects beta through the browser flow with the
// test's recording client, replays its session and leaves gamma's
// unused; it returns every session, result and flow cookie handed out.
func connectThroughBrowser(t *testing.T, s *stack, browser *http.Client) []string {
	var credentials []string
	connectURL := s.connectSession("beta", "")
	unused := s.connectSession("gamma", "")
	for _, u := range []string{connectURL, unused} {
		parsed, _ := url.Parse(u)
		sess := parsed.Query().Get("session")
		credentials = append(credentials, sess, strings.TrimPrefix(sess, "tgs_"))
	}
	for range 2 { // the second use is a replay: 401
		resp, body := press(t, browser, connectURL)
		back := returned(resp)
		switch {
		case back != nil && back.Query().Get("status") == "pending":
			result := back.Query().Get("result")
			credentials = append(credentials, result, strings.TrimPrefix(result, "tgr_"))
			if code, _, raw := s.redeem(s.key, result); code != http.StatusOK {
				t.Fatalf("redeem: %d %s", code, raw)
			}
		case resp.StatusCode != http.StatusUnauthorized:
			t.Fatalf("connect flow: %s %s", resp.Status, body)
		}
	}
	for _, u := range browser.Jar.Cookies(&url.URL{Scheme: "http", Host: s.addr, Path: "/"}) {
		credentials = append(credentials, u.Value) // flow cookies left, if any
	}
	return credentials
}

// scanOutputs looks for tokens, codes, credentials and the client secret
// in every output; it returns the lines at debug level and in all.
func scanOutputs(t *testing.T, outputs map[string]string, tokens, codes, credentials []string, clientSecret string) (debug, total int) {
	for name, text := range outputs {
		total += strings.Count(text, "\n")
		if strings.HasSuffix(name, "stderr") {
			debug += len(debugLevel.FindAllStringIndex(text, -1))
		}
		if hits := scan(text, tokens); len(hits) > 0 {
			t.Errorf("%s: %d line(s) carry a token, e.g. %q", name, len(hits), tail(hits[0], 300))
		}
		for l := range strings.SplitSeq(text, "\n") {
			if strings.Contains(l, `"connect_url"`) {
				continue // the answer to POST /connect-sessions hands a session out
			}
			if name == "HTTP answers to the test" && (strings.Contains(l, `name="session"`) || strings.Contains(l, "status=pending")) {
				continue // the consent page's form carries its link's session; the callback sends the result to return_to
			}
			for _, c := range credentials {
				if c != "" && strings.Contains(l, c) {
					t.Errorf("%s: a line carries an API key, session token, flow cookie or the webhook secret: %q", name, tail(l, 300))
				}
			}
		}
		if hits := scan(text, codes); len(hits) > 0 {
			t.Errorf("%s: %d line(s) carry an authorization code, e.g. %q", name, len(hits), tail(hits[0], 300))
		}
		if strings.Contains(text, clientSecret) {
			t.Errorf("%s: the client secret was printed", name)
		}
	}
	return debug, total
}

// testKillHolderOthersProceed kills the worker with SIGKILL while its
// refresh request is held at the provider (it holds the refresh lease, no
// lock and no database connection), with the server and a batch run
// waiting for that lease. The dead worker's request is unresolved: nobody
// presents its refresh token until the lease runs out, a second after the
// answer deadline (TOKEN_ANSWER_DEADLINE=2s here). Meanwhile callers get
// an answer within TOKEN_LOCK_WAIT (a still-valid token, or 503); then the
// next process records the lost answer, probes the provider and presents
// the token once, and calls succeed again.
func testKillHolderOthersProceed(t *testing.T, bin string) {
	const (
		lockWait       = 4 * time.Second // newStack's TOKEN_LOCK_WAIT
		answerDeadline = 2 * time.Second
		leaseTerm      = time.Second // a lease outlives its deadline by its renewal term
	)
	held := newHeldRefresh() // the worker's request, until the test ends
	s := newStack(t, bin, stackOpts{lifetime: lifetime, skew: skew, fault: held.fault,
		extraEnv: []string{"TOKEN_ANSWER_DEADLINE=" + answerDeadline.String()}})
	t.Cleanup(held.let) // before the sandbox closes
	s.migrate()
	const conn = "acme"
	s.importGrant(conn)
	server := s.start("server")
	s.waitHealthy(server)
	worker := s.start("worker")
	waitChecked(t, server, worker) // their start-up probes are not the refresh to hold
	// Only events (the worker) use the token until the kill.
	stopEvents := make(chan struct{})
	var evBad atomic.Int64
	var evWG sync.WaitGroup
	evWG.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stopEvents:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if code, _ := s.do(http.MethodPost, "/connections/"+conn+"/events", fmt.Sprintf(`{"n":%d}`, i)); code != http.StatusAccepted {
				evBad.Add(1)
			}
		}
	})
	held.armed.Store(true)
	select {
	case <-held.hit:
	case <-time.After(3 * lifetime):
		t.Fatal("no refresh reached the provider")
	}
	presented := time.Now()
	if n := advisoryLocks(t, s.dbURL); n != 0 {
		t.Fatalf("lock holders while the worker's refresh is at the provider = %d, want 0 (it holds its lease only)", n)
	}
	if n := leaseRows(t, s.dbURL); n != 1 {
		t.Fatalf("refresh leases while the worker refreshes = %d, want 1", n)
	}
	// The server and a batch run now need the token and wait for the lease.
	server2 := startStatusLoad(s, conn, 3)
	type batchOut struct {
		r    result
		done time.Time
	}
	batchDone := make(chan batchOut, 1)
	go func() {
		cmd := exec.Command(filepath.Join(bin, "batch"))
		cmd.Env = s.env
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		_ = cmd.Run()
		batchDone <- batchOut{result{cmd.ProcessState.ExitCode(), out.String(), errb.String()}, time.Now()}
	}()
	time.Sleep(time.Second) // both are waiting for the worker's lease by now
	server2.reset()
	if err := syscall.Kill(worker.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	worker.Wait()
	var b batchOut
	select {
	case b = <-batchDone:
	case <-time.After(2 * lockWait):
		t.Fatal("the batch run did not finish")
	}
	waitfor.Until(t, answerDeadline+leaseTerm+lockWait, "no successful server call after the kill", server2.served)

	time.Sleep(lifetime - skew) // the next refresh, without the worker
	server2.mu.Lock()
	firstOK := server2.firstOK
	server2.mu.Unlock()
	counts := server2.finish()
	close(stopEvents)
	evWG.Wait()
	s.stop(server)
	dumpLogs(t, server, worker)
	st := s.sb.Stats()

	serverTook, batchTook := firstOK.Sub(killed), b.done.Sub(killed)
	t.Logf("kill -9 of the lease holder: first server 200 after %v (%v after the presentation), batch done after %v; server answers %v; batch: %s; provider: %d refreshes, %d faults, %d reuse",
		serverTook.Round(time.Millisecond), firstOK.Sub(presented).Round(time.Millisecond), batchTook.Round(time.Millisecond), counts,
		strings.TrimSpace(b.r.stdout), st.Refreshes, st.RefreshFaults, st.RefreshReuse)
	if firstOK.Sub(presented) < answerDeadline {
		t.Errorf("server: a new token %v after the dead worker presented the refresh token, before the answer deadline %v",
			firstOK.Sub(presented), answerDeadline)
	}
	if serverTook >= answerDeadline+leaseTerm+lockWait {
		t.Errorf("server: first successful call %v after the kill", serverTook)
	}
	for k, n := range counts {
		if k != "200" && k != "503 provider_unavailable" && k != "503 refresh_failing" {
			t.Errorf("server answered %q %d times after the kill", k, n)
		}
	}
	var round batch.Round
	if json.Unmarshal([]byte(strings.TrimSpace(b.r.stdout)), &round) != nil || round.Succeeded+round.Failed != 1 {
		t.Errorf("batch run: exit %d, stdout %q, stderr %s", b.r.code, b.r.stdout, tail(b.r.stderr, 2000))
	}
	if batchTook >= lockWait {
		t.Errorf("batch finished %v after the kill, bound %v", batchTook, lockWait)
	}
	if evBad.Load() > 0 {
		t.Errorf("%d events not accepted", evBad.Load())
	}
	if st.RefreshReuse != 0 || st.RefreshFaults != 0 || st.Refreshes == 0 {
		t.Errorf("provider: %d reuse, %d faults answered (the dead worker's request is still held), %d refreshes", st.RefreshReuse, st.RefreshFaults, st.Refreshes)
	}
}
