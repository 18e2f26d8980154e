// Package e2e tests the four binaries as separate OS processes against a
// fresh Postgres database and the sandbox provider. go test -short skips it.
package e2e

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokenguard/tokenguard/infra/batch"
	"github.com/tokenguard/tokenguard/internal/pgbouncer"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/testdb"
	"github.com/tokenguard/tokenguard/tools/internal/demo"
)

func TestMain(m *testing.M) {
	testdb.Main(runFunc(func() int {
		defer bouncer.Close()
		return m.Run()
	}))
}

type runFunc func() int

func (f runFunc) Run() int { return f() }

// The apps reach Postgres through a PgBouncer in transaction pooling mode
// (DATABASE_URL), as a fleet usually does, with DATABASE_LISTEN_URL direct.
// E2E_PGBOUNCER=off runs them on the direct URL; without pgbouncer
// installed they run direct too, except under CI, where that fails.
var (
	bouncerOnce sync.Once
	bouncer     *pgbouncer.Bouncer
	bouncerErr  error
)

// pooled returns dbURL through the test PgBouncer, or "" to run direct.
func pooled(t *testing.T, dbURL string) string {
	t.Helper()
	if os.Getenv("E2E_PGBOUNCER") == "off" {
		return ""
	}
	bouncerOnce.Do(func() {
		if _, err := pgbouncer.Binary(); err != nil {
			if os.Getenv("CI") != "" {
				bouncerErr = err
			}
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		bouncer, bouncerErr = pgbouncer.Start(ctx, testdb.URL(t), 20)
	})
	if bouncerErr != nil {
		t.Fatalf("pgbouncer: %v", bouncerErr)
	}
	if bouncer == nil {
		t.Log("pgbouncer not installed: the apps connect to Postgres directly")
		return ""
	}
	u, err := bouncer.URL(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// buildApps builds the apps, tokenctl and the sandbox once per test run into dir.
func buildApps(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	args := []string{"build", "-o", dir + string(os.PathSeparator)}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, "github.com/tokenguard/tokenguard/cmd/server", "github.com/tokenguard/tokenguard/cmd/worker",
		"github.com/tokenguard/tokenguard/cmd/batch", "github.com/tokenguard/tokenguard/cmd/tokenctl",
		"github.com/tokenguard/tokenguard/tools/cmd/sandbox")
	start := time.Now()
	out, err := exec.Command("go", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	t.Logf("built the apps (race: %t) in %v", raceEnabled, time.Since(start).Round(time.Millisecond))
	return dir
}

// controlServer builds, once per test run, the server as it was before
// the redeem step and the public routes' limits (the build tag
// tokenguard_e2e_callbackstores): the controls run the attacks on it.
func controlServer(t *testing.T) string {
	t.Helper()
	controlOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tokenguard-control-")
		if err != nil {
			controlErr = err
			return
		}
		testdb.AtExit(func() { _ = os.RemoveAll(dir) })
		args := []string{"build", "-tags", "tokenguard_e2e_callbackstores", "-o", filepath.Join(dir, "server")}
		if raceEnabled {
			args = append(args, "-race")
		}
		out, err := exec.Command("go", append(args, "github.com/tokenguard/tokenguard/cmd/server")...).CombinedOutput()
		if err != nil {
			controlErr = fmt.Errorf("go build the control server: %v\n%s", err, out)
			return
		}
		controlBin = filepath.Join(dir, "server")
	})
	if controlErr != nil {
		t.Fatal(controlErr)
	}
	return controlBin
}

var (
	controlOnce sync.Once
	controlBin  string
	controlErr  error
)

// stack is one database, one sandbox provider and the apps' environment.
type stack struct {
	t      *testing.T
	bin    string
	dbURL  string
	sb     *demo.Sandbox
	addr   string
	env    []string
	client *http.Client
	key    string // the API key tokenctl apikey create made, once migrated
	// serverBin, when set, is the server binary start runs instead of
	// bin's (the control build).
	serverBin string
}

type stackOpts struct {
	lifetime time.Duration
	skew     time.Duration
	fault    func() sandbox.Fault
	scopes   []string // the sandbox's allowed scopes (default: api)
	extraEnv []string
	// clientAuth restricts the sandbox's client authentication
	// (sandbox.ClientAuthPost: form body only); omitExpiresIn leaves
	// expires_in out of its answers.
	clientAuth    string
	omitExpiresIn bool
	extraFields   map[string]string // added to every token answer
	// dex answers as Dex does (sandbox.Dex); secret, when set, is the
	// apps' OAUTH_CLIENT_SECRET instead of the sandbox's.
	dex    bool
	secret string
	// refreshScopes, when not nil, narrows what the sandbox's refreshes
	// grant (sandbox.Options.RefreshScopes); omitRefreshScope leaves scope
	// out of its refresh answers.
	refreshScopes    []string
	omitRefreshScope bool
}

func newStack(t *testing.T, bin string, o stackOpts) *stack {
	t.Helper()
	dbURL := testdb.NewEmpty(t) // tokenctl migrate applies the migrations
	sopts := sandbox.Options{AccessTokenLifespan: o.lifetime, RefreshFault: o.fault, Scopes: o.scopes,
		ClientAuth: o.clientAuth, OmitExpiresIn: o.omitExpiresIn, ExtraTokenFields: o.extraFields,
		RefreshScopes: o.refreshScopes, OmitRefreshScope: o.omitRefreshScope}
	if o.dex {
		sopts = sandbox.Dex(sopts)
	}
	sb, err := demo.StartSandbox("127.0.0.1:0", sopts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sb.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg := sb.OAuth2Config(sb.URL)
	appURL := dbURL
	if u := pooled(t, dbURL); u != "" {
		appURL = u
		o.extraEnv = append([]string{"DATABASE_LISTEN_URL=" + dbURL}, o.extraEnv...)
	}
	env := append(baseEnv(),
		"DATABASE_URL="+appURL,
		"OAUTH_CLIENT_ID="+cfg.ClientID,
		"OAUTH_CLIENT_SECRET="+cmp.Or(o.secret, cfg.ClientSecret),
		"OAUTH_TOKEN_URL="+cfg.Endpoint.TokenURL,
		"OAUTH_AUTH_URL="+cfg.Endpoint.AuthURL,
		"OAUTH_REDIRECT_URL=http://"+addr+"/oauth/callback",
		"OAUTH_SCOPES=api",
		"API_BASE_URL="+sb.URL,
		"CONNECT_RETURN_URLS=http://app.example/",
		"HTTP_ADDR="+addr,
		"TOKEN_REFRESH_SKEW="+o.skew.String(),
		"TOKEN_LOCK_WAIT=4s",
		"TOKEN_REFRESH_TIMEOUT=2s",
		"API_TIMEOUT=3s",
		"LOG_LEVEL=info",
		// One key drives every test's load.
		"API_KEY_RATE=100000",
		"API_KEY_BURST=100000",
	)
	s := &stack{t: t, bin: bin, dbURL: dbURL, sb: sb, addr: addr, env: append(env, o.extraEnv...),
		client: &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 32}}}
	t.Cleanup(s.client.CloseIdleConnections)
	return s
}

// checkPooled fails unless, when the apps run through the test PgBouncer,
// it pooled transactions of their database.
func (s *stack) checkPooled() {
	s.t.Helper()
	if bouncer == nil {
		return
	}
	u, err := url.Parse(s.dbURL)
	if err != nil {
		s.t.Fatal(err)
	}
	n, err := bouncer.Transactions(context.Background(), u.User.Username(), strings.TrimPrefix(u.Path, "/"))
	if err != nil || n == 0 {
		s.t.Fatalf("the apps' transactions through PgBouncer: %d, %v", n, err)
	}
	s.t.Logf("PgBouncer (transaction pooling) carried %d of the apps' transactions", n)
}

// baseEnv is a clean environment: nothing from the developer's shell
// (DATABASE_URL, OAUTH_*) reaches the apps.
func baseEnv() []string {
	return []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "GORACE=halt_on_error=1"}
}

// result of a short-lived command.
type result struct {
	code           int
	stdout, stderr string
}

// run runs a binary to completion.
func run(t *testing.T, bin, name string, env []string, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, name), args...)
	cmd.Env = env
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !asExitError(err, &ee) {
		t.Fatalf("%s %v: %v", name, args, err)
	}
	return result{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}
}

func asExitError(err error, target **exec.ExitError) bool {
	ee, ok := err.(*exec.ExitError)
	if ok {
		*target = ee
	}
	return ok
}

// migrate applies the migrations and creates the stack's API key.
func (s *stack) migrate() {
	s.t.Helper()
	if r := run(s.t, s.bin, "tokenctl", s.env, "", "migrate"); r.code != 0 {
		s.t.Fatalf("tokenctl migrate: exit %d: %s", r.code, r.stderr)
	}
	s.key = s.newKey("e2e")
}

// newKey runs tokenctl apikey create and checks its contract: the key
// alone on one line of stdout, exit 0.
func (s *stack) newKey(name string) string {
	s.t.Helper()
	r := run(s.t, s.bin, "tokenctl", s.env, "", "apikey", "create", "--name", name)
	key := strings.TrimSuffix(r.stdout, "\n")
	if r.code != 0 || !strings.HasPrefix(key, "tgk_") || len(key) < 4+43 || strings.ContainsAny(key, " \n\t") {
		s.t.Fatalf("tokenctl apikey create: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	return key
}

// importGrant runs the authorization-code flow at the sandbox and imports
// the token with tokenctl; it returns when the token was granted.
func (s *stack) importGrant(name string) time.Time {
	s.t.Helper()
	tok, err := sandbox.Grant(context.Background(), s.sb.OAuth2Config(s.sb.URL))
	if err != nil {
		s.t.Fatal(err)
	}
	granted := time.Now()
	js, _ := json.Marshal(tok)
	if r := run(s.t, s.bin, "tokenctl", s.env, string(js), "import", "--connection", name); r.code != 0 {
		s.t.Fatalf("tokenctl import: exit %d: %s", r.code, r.stderr)
	}
	return granted
}

// app is a long-running app process with its output captured.
type app struct {
	*demo.Proc
	mu     sync.Mutex
	stderr bytes.Buffer
	lines  []string // stdout lines
	outEOF chan struct{}
}

func (a *app) Write(p []byte) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stderr.Write(p)
}

func (a *app) Stderr() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stderr.String()
}

func (s *stack) start(name string, args ...string) *app {
	s.t.Helper()
	a := &app{outEOF: make(chan struct{})}
	pr, pw := io.Pipe()
	go func() {
		defer close(a.outEOF)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			a.mu.Lock()
			a.lines = append(a.lines, sc.Text())
			a.mu.Unlock()
		}
	}()
	path := filepath.Join(s.bin, name)
	if name == "server" && s.serverBin != "" {
		path = s.serverBin
	}
	p, err := demo.Start(demo.ProcSpec{Name: name, Path: path, Args: args, Env: s.env, Stdout: pw, Stderr: a})
	if err != nil {
		s.t.Fatal(err)
	}
	go func() { <-p.Done(); pw.Close() }()
	a.Proc = p
	s.t.Cleanup(func() {
		p.Kill()
		if s.t.Failed() {
			s.t.Logf("%s stderr:\n%s", name, tail(a.Stderr(), 4000))
		}
	})
	return a
}

// stop sends SIGTERM and checks the contract: exit 0 within 10 s.
func (s *stack) stop(a *app) {
	s.t.Helper()
	st := a.Stop(10 * time.Second)
	if st.Killed || st.ExitCode != 0 {
		s.t.Errorf("%s after SIGTERM: exit %d in %v (killed: %t)", a.Name, st.ExitCode, st.Took, st.Killed)
	} else {
		s.t.Logf("%s stopped on SIGTERM in %v", a.Name, st.Took.Round(time.Millisecond))
	}
}

func (s *stack) waitHealthy(a *app) {
	s.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := s.client.Get("http://" + s.addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-a.Done():
			s.t.Fatalf("server exited %d: %s", a.ExitCode(), a.Stderr())
		case <-time.After(50 * time.Millisecond):
		}
	}
	s.t.Fatal("server not healthy within 30s")
}

// get calls the server and returns status and body.
func (s *stack) do(method, path, body string) (int, string) {
	s.t.Helper()
	return s.doWith(s.key, method, path, body)
}

// doWith calls the server with API key key ("" for none).
func (s *stack) doWith(key, method, path, body string) (int, string) {
	s.t.Helper()
	req, _ := http.NewRequest(method, "http://"+s.addr+path, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// connectSession asks the server for a connect URL (POST /connect-sessions)
// with the request body extra fields merged in.
// A session names defaultReturnTo unless extra names a return_to.
func (s *stack) connectSession(name string, extra string) string {
	s.t.Helper()
	if !strings.Contains(extra, `"return_to"`) {
		extra += `,"return_to":"` + defaultReturnTo + `"`
	}
	body := `{"connection":"` + name + `"` + extra + `}`
	code, resp := s.do(http.MethodPost, "/connect-sessions", body)
	var out struct {
		ConnectURL string    `json:"connect_url"`
		ExpiresAt  time.Time `json:"expires_at"`
	}
	if code != http.StatusCreated || json.Unmarshal([]byte(resp), &out) != nil ||
		!strings.HasPrefix(out.ConnectURL, "http://"+s.addr+"/oauth/connect?session=tgs_") ||
		time.Until(out.ExpiresAt) < 9*time.Minute || time.Until(out.ExpiresAt) > 11*time.Minute {
		s.t.Fatalf("POST /connect-sessions %s: %d %s", body, code, resp)
	}
	return out.ConnectURL
}

// rounds parses the batch's JSON lines.
func rounds(t *testing.T, a *app) []batch.Round {
	<-a.outEOF
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []batch.Round
	for _, l := range a.lines {
		var r batch.Round
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Errorf("batch printed a line that is not a round: %q", l)
			continue
		}
		out = append(out, r)
	}
	return out
}

// job is an event's row in River's table.
type job struct {
	ID      int64
	State   string
	Attempt int
	Errors  int
}

func jobs(t *testing.T, dbURL string, ids []int64) map[int64]job {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT id, state, attempt, coalesce(array_length(errors, 1), 0) FROM river_job WHERE id = ANY($1)`, ids)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64]job{}
	for rows.Next() {
		var j job
		if err := rows.Scan(&j.ID, &j.State, &j.Attempt, &j.Errors); err != nil {
			t.Fatal(err)
		}
		out[j.ID] = j
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// waitEvents waits until every event is completed; it returns the rows.
func waitEvents(t *testing.T, dbURL string, ids []int64, within time.Duration) map[int64]job {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		js := jobs(t, dbURL, ids)
		done := 0
		for _, j := range js {
			if j.State == "completed" {
				done++
			}
		}
		if done == len(ids) || time.Now().After(deadline) {
			return js
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// heldRefresh is a provider fault that, once armed, holds the next refresh
// request until released and then answers 503, so nothing is rotated: as
// when the dying process's request never got through. With then set to
// FaultNone the released request is answered normally and rotates.
type heldRefresh struct {
	armed   atomic.Bool
	hit     chan struct{} // closed when the held request arrived
	release chan struct{}
	once    sync.Once
	then    sandbox.Fault
}

func newHeldRefresh() *heldRefresh {
	return &heldRefresh{hit: make(chan struct{}), release: make(chan struct{}), then: sandbox.FaultUnavailable}
}

func (h *heldRefresh) fault() sandbox.Fault {
	if !h.armed.CompareAndSwap(true, false) {
		return sandbox.FaultNone
	}
	close(h.hit)
	<-h.release
	return h.then
}

// let answers the held request (safe to call more than once).
func (h *heldRefresh) let() { h.once.Do(func() { close(h.release) }) }
