// Package demo runs tokenguard end to end on one machine: a fresh
// database, two sandbox providers with different quirks (one the OAUTH_*
// settings name, one stored with tokenctl provider add), and the server,
// worker and batch apps as separate OS processes under load, then reports
// what every app and each provider saw. cmd/demo (make demo) drives it;
// cmd/sandbox reuses its sandbox server.
package demo

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/infra/batch"
	"github.com/tokenguard/tokenguard/internal/pgserver"
	"github.com/tokenguard/tokenguard/internal/sandbox"
)

// Options configure a run. Zero values take the defaults.
type Options struct {
	BinDir        string        // the built apps (default "bin")
	OutDir        string        // logs and report.json (default "demo-out")
	Duration      time.Duration // load phase (default 30s)
	TokenLifetime time.Duration // access-token lifetime at the OAUTH_* sandbox (default 3s)
	// StoredTokenLifetime is the access-token lifetime at the stored
	// provider's sandbox, which does not say it (no expires_in): tokenctl
	// provider add --default-lifetime tells the apps (default twice
	// TokenLifetime).
	StoredTokenLifetime time.Duration
	Skew                time.Duration // TOKEN_REFRESH_SKEW (default 1s)
	Concurrency         int           // concurrent HTTP clients of the server (default 4)
	EventsPerSecond     int           // events posted to the server (default 20)
	BatchEvery          time.Duration // batch --every (default 1s)
	Live                bool          // redraw one progress line (a terminal) instead of printing lines
}

func (o Options) withDefaults() Options {
	if o.BinDir == "" {
		o.BinDir = "bin"
	}
	if o.OutDir == "" {
		o.OutDir = "demo-out"
	}
	if o.Duration <= 0 {
		o.Duration = 30 * time.Second
	}
	if o.TokenLifetime <= 0 {
		o.TokenLifetime = 3 * time.Second
	}
	if o.StoredTokenLifetime <= 0 {
		o.StoredTokenLifetime = 2 * o.TokenLifetime
	}
	if o.Skew <= 0 {
		o.Skew = time.Second
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 4
	}
	if o.EventsPerSecond <= 0 {
		o.EventsPerSecond = 20
	}
	if o.BatchEvery <= 0 {
		o.BatchEvery = time.Second
	}
	return o
}

// storedProvider is the name the demo's second provider is stored under
// (tokenctl provider add).
const storedProvider = "sandbox-form"

// Connections the demo creates: the first through the browser flow of the
// server, the second with tokenctl import, both at the OAUTH_* provider;
// the third with tokenctl import --provider, at the stored one.
var connections = []string{"acme", "globex", "initech"}

// demoProvider is one of the demo's sandboxes and what the report says of
// it.
type demoProvider struct {
	name     string // the stored provider's name; "" is the OAUTH_* one
	sb       *Sandbox
	lifetime time.Duration // of its access tokens, said or not
	quirks   string
	conns    []string
	// refused says why it refuses refresh requests in a run that goes
	// well (none of them spends a refresh token).
	refused string
	// noExpiry: its answers carry no expires_in, so the imported first
	// token has no expiry and is used until the provider refuses it (401).
	noExpiry bool
}

// report is what the provider saw while its connections, granted at
// granted, were in use from loadStart to loadEnd.
func (p *demoProvider) report(granted map[string]time.Time, skew time.Duration, loadStart, loadEnd time.Time) ProviderReport {
	st := p.sb.Stats()
	expected := 0
	for _, name := range p.conns {
		at := granted[name]
		if p.noExpiry {
			// The first token has no expiry: it is refreshed when the
			// provider refuses it, at its real lifetime, not a skew
			// before.
			at = at.Add(skew)
		}
		expected += ExpectedRefreshes(at, loadStart, loadEnd, p.lifetime-skew)
	}
	byApp := map[string]int{}
	for _, rec := range p.sb.Timeline().Refreshes {
		byApp[strings.TrimPrefix(rec.Agent, "tokenguard-")]++
	}
	var notes []string
	if refused := st.RefreshRejected - st.RefreshReuse; refused > 0 && p.refused != "" {
		notes = append(notes, fmt.Sprintf("%d refresh request(s) refused, no grant touched: %s", refused, p.refused))
	}
	if p.noExpiry && st.Resource401 > 0 {
		notes = append(notes, fmt.Sprintf("%d × 401: the imported first token said no expiry, so the apps used it until the provider refused it, "+
			"then refreshed and retried; later tokens live --default-lifetime %s", st.Resource401, p.lifetime))
	}
	return ProviderReport{
		Name: p.name, URL: p.sb.URL, Quirks: p.quirks, AccessTokenLifetime: p.lifetime.Seconds(), Connections: p.conns,
		Refreshes: st.Refreshes, ExpectedRefreshes: expected, RefreshReuse: st.RefreshReuse, RefreshRejected: st.RefreshRejected,
		Resource401: st.Resource401, ResourceOK: st.ResourceOK, ByAgent: st.ResourceByAgent, RefreshesByApp: byApp,
		CodeExchanges: st.CodeExchanges, Notes: notes,
	}
}

// run is one demo run's state.
type run struct {
	o      Options
	out    io.Writer
	env    []string
	server string // base URL of the server app
	key    string // the API key tokenctl apikey create made
	hooks  *hookReceiver
	sb     *Sandbox // the OAUTH_* provider
	stored *Sandbox // the provider stored with tokenctl provider add
	provs  []*demoProvider
	db     *pgx.Conn
	procs  map[string]*Proc
	logs   []*os.File

	granted   map[string]time.Time
	serverOK  atomic.Int64
	serverBad atomic.Int64
	enqBad    atomic.Int64
	eventsMu  sync.Mutex
	eventIDs  []int64
	rounds    atomic.Int64
	batchOK   atomic.Int64
	batchBad  atomic.Int64
	batchDone chan struct{}
	fails     failures // per app and second, for the timeline
}

// Run runs the demo. The report is returned even when the run failed or
// was interrupted (ctx done); the error is for runs that could not start.
func Run(ctx context.Context, o Options, out io.Writer) (*Report, error) {
	o = o.withDefaults()
	r := &run{o: o, out: out, procs: map[string]*Proc{}, granted: map[string]time.Time{}, batchDone: make(chan struct{})}
	rep := &Report{
		StartedAt: time.Now().UTC(), RefreshSkew: o.Skew.Seconds(),
		Connections: connections, Apps: map[string]AppReport{}, Shutdown: map[string]Stopped{},
	}
	for _, name := range []string{"tokenctl", "server", "worker", "batch"} {
		if _, err := os.Stat(filepath.Join(o.BinDir, name)); err != nil {
			return nil, fmt.Errorf("%s/%s is missing: run make build first", o.BinDir, name)
		}
	}
	if err := os.MkdirAll(o.OutDir, 0o755); err != nil {
		return nil, err
	}
	defer r.closeLogs()
	r.say("tokenguard demo: %s of load, 2 providers, access tokens refreshed %s before expiry", o.Duration, o.Skew)

	srv, err := pgserver.Find(ctx, pgserver.Options{URLVar: "DATABASE_URL", Note: func(s string) { r.say("  %s", s) }})
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	dbURL, drop, err := pgserver.CreateDatabase(ctx, srv.URL, "tokenguard_demo")
	if err != nil {
		return nil, err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := drop(ctx); err != nil {
			r.say("warning: could not drop the demo database: %v", err)
		}
	}()
	rep.Database = srv.Source
	r.say("  database:  fresh database on %s (%s), dropped at the end", redact(dbURL), srv.Source)

	// Two independent providers, each with its own client and quirks;
	// both rotate refresh tokens and revoke the old access token on
	// refresh.
	r.sb, err = StartSandbox("127.0.0.1:0", sandbox.Options{AccessTokenLifespan: o.TokenLifetime, ClientAuth: sandbox.ClientAuthBasic})
	if err != nil {
		return nil, err
	}
	defer r.sb.Close()
	r.stored, err = StartSandbox("127.0.0.1:0", sandbox.Options{AccessTokenLifespan: o.StoredTokenLifetime, ClientAuth: sandbox.ClientAuthPost,
		OmitExpiresIn: true, ClientID: "tokenguard-form", ClientSecret: "sandbox-form-" + rand.Text()})
	if err != nil {
		return nil, err
	}
	defer r.stored.Close()
	r.provs = []*demoProvider{
		{sb: r.sb, lifetime: o.TokenLifetime, conns: connections[:2],
			refused: "each app checks the token endpoint at start with a made-up refresh token (invalid_grant)",
			quirks:  fmt.Sprintf("HTTP Basic only, %s tokens, expires_in %.0f", o.TokenLifetime, o.TokenLifetime.Seconds())},
		{name: storedProvider, sb: r.stored, lifetime: o.StoredTokenLifetime, conns: connections[2:], noExpiry: true,
			refused: "auth style auto tries HTTP Basic first (invalid_client), then the form body, and remembers it",
			quirks:  fmt.Sprintf("form body only, %s tokens, no expires_in", o.StoredTokenLifetime)},
	}
	r.say("  providers: OAUTH_* sandbox at %s (%s)", r.sb.URL, r.provs[0].quirks)
	r.say("             %s sandbox at %s (%s)", storedProvider, r.stored.URL, r.provs[1].quirks)
	r.say("             both rotate refresh tokens and revoke the old access token on refresh")

	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	r.server = "http://" + addr
	if r.hooks, err = startHookReceiver(); err != nil {
		return nil, err
	}
	defer r.hooks.Close()
	cfg := r.sb.OAuth2Config(r.sb.URL)
	r.env = Env(
		"DATABASE_URL="+dbURL,
		"OAUTH_CLIENT_ID="+cfg.ClientID,
		"OAUTH_CLIENT_SECRET="+cfg.ClientSecret,
		"OAUTH_TOKEN_URL="+cfg.Endpoint.TokenURL,
		"OAUTH_AUTH_URL="+cfg.Endpoint.AuthURL,
		"OAUTH_REDIRECT_URL="+r.server+"/oauth/callback",
		"OAUTH_SCOPES="+strings.Join(cfg.Scopes, ","),
		"API_BASE_URL="+r.sb.URL,
		"OAUTH_USERINFO_URL="+r.sb.URL+"/userinfo",
		"HTTP_ADDR="+addr,
		"TOKEN_REFRESH_SKEW="+o.Skew.String(),
		"TOKEN_LOCK_WAIT=5s",
		"TOKEN_REFRESH_TIMEOUT=3s",
		"API_TIMEOUT=5s",
		"WORKER_JOB_TIMEOUT=15s",
		"LOG_LEVEL=info",
		"LOG_FORMAT=json", // the timeline reads the "token refresh" lines
		"WEBHOOK_URL="+r.hooks.URL,
		"WEBHOOK_SECRET="+r.hooks.Secret,
		"CONNECT_RETURN_URLS="+demoApp,
		// One key drives all of the demo's load.
		"API_KEY_RATE=100000",
		"API_KEY_BURST=100000",
	)
	defer r.stopAll(rep) // on every path, including errors and Ctrl-C

	if err := r.tool(ctx, "migrate", nil, "migrate"); err != nil {
		return nil, err
	}
	r.say("  migrated:  bin/tokenctl migrate")
	if r.key, err = r.createKey(ctx); err != nil {
		return nil, err
	}
	r.say("  API key:   bin/tokenctl apikey create --name demo --scopes connect,api:call --connections %s (every request below carries it)",
		strings.Join(connections, ","))
	if err := r.addProvider(ctx); err != nil {
		return nil, err
	}
	r.say("  provider:  %s stored with bin/tokenctl provider add (client secret on stdin, auth style auto, --default-lifetime %s)",
		storedProvider, o.StoredTokenLifetime)
	if err := r.startServer(ctx); err != nil {
		return nil, err
	}
	if err := r.connectViaBrowserFlow(ctx, connections[0]); err != nil {
		return nil, err
	}
	r.say("  connected: %q through a connect session (POST /connect-sessions, the consent page's button, the provider, back to return_to with a pending result, POST /connect-results)", connections[0])
	if err := r.importToken(ctx, connections[1], "", cfg); err != nil {
		return nil, err
	}
	r.say("  imported:  %q with bin/tokenctl import (token JSON on stdin)", connections[1])
	if err := r.importToken(ctx, connections[2], storedProvider, r.stored.OAuth2Config(r.stored.URL)); err != nil {
		return nil, err
	}
	r.say("  imported:  %q with bin/tokenctl import --provider %s", connections[2], storedProvider)
	loadStart := time.Now()
	if err := r.startWorkerAndBatch(); err != nil {
		return nil, err
	}
	for _, name := range connections {
		if err := r.hooks.waitFor("connection.connected "+name, 15*time.Second); err != nil {
			return nil, err
		}
	}
	r.say("  webhooks:  connection.connected for %s, signatures verified (the worker delivers them)", strings.Join(connections, ", "))
	r.say("  apps:      server pid %d, worker pid %d, batch --every %s pid %d; logs in %s/",
		r.procs["server"].Pid(), r.procs["worker"].Pid(), o.BatchEvery, r.procs["batch"].Pid(), o.OutDir)
	// The demo's own throw-away key, made for this run's database: shown
	// so that the console can be opened while the load runs.
	r.say("  console:   %s/console while the load runs; log in with the demo's API key %s", r.server, r.key)
	if r.db, err = pgx.Connect(ctx, dbURL); err != nil {
		return nil, err
	}
	defer r.db.Close(context.Background())
	r.say("")

	rep.Interrupted = !r.load(ctx)
	r.drain(ctx)
	loadEnd := time.Now()
	r.stopAll(rep)
	stopped := time.Now()
	rep.DurationSeconds = loadEnd.Sub(loadStart).Round(time.Second).Seconds()
	r.finish(rep, loadStart, loadEnd)
	if rep.Timeline, err = r.timeline(stopped); err != nil {
		rep.Problems = append(rep.Problems, "timeline: "+err.Error())
		rep.OK = false
	}
	if err := r.statusTable(); err != nil {
		rep.Problems = append(rep.Problems, "tokenctl status: "+err.Error())
		rep.OK = false
	}
	return rep, nil
}

func (r *run) say(format string, a ...any) { fmt.Fprintf(r.out, format+"\n", a...) }

func (r *run) logFile(name string) (*os.File, error) {
	f, err := os.Create(filepath.Join(r.o.OutDir, name+".log"))
	if err != nil {
		return nil, err
	}
	r.logs = append(r.logs, f)
	return f, nil
}

func (r *run) closeLogs() {
	for _, f := range r.logs {
		_ = f.Close()
	}
}

// tool runs bin/tokenctl and fails unless it exits 0; its output goes to
// tokenctl-<logName>.log.
func (r *run) tool(ctx context.Context, logName string, stdin io.Reader, args ...string) error {
	log, err := r.logFile("tokenctl-" + logName)
	if err != nil {
		return err
	}
	var stderr bytes.Buffer
	p, err := Start(ProcSpec{Name: "tokenctl", Path: filepath.Join(r.o.BinDir, "tokenctl"), Args: args, Env: r.env,
		Stdin: stdin, Stdout: log, Stderr: io.MultiWriter(log, &stderr)})
	if err != nil {
		return err
	}
	select {
	case <-p.Done():
	case <-ctx.Done():
		p.Stop(10 * time.Second)
		return ctx.Err()
	}
	if code := p.ExitCode(); code != 0 {
		return fmt.Errorf("tokenctl %s exited %d: %s", args[0], code, strings.TrimSpace(stderr.String()))
	}
	return nil
}

func (r *run) start(name string, stdout io.Writer, args ...string) error {
	log, err := r.logFile(name)
	if err != nil {
		return err
	}
	if stdout == nil {
		stdout = log
	}
	p, err := Start(ProcSpec{Name: name, Path: filepath.Join(r.o.BinDir, name), Args: args, Env: r.env, Stdout: stdout, Stderr: log})
	if err != nil {
		return err
	}
	r.procs[name] = p
	return nil
}

func (r *run) startServer(ctx context.Context) error {
	if err := r.start("server", nil); err != nil {
		return err
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(r.server + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-r.procs["server"].Done():
			return fmt.Errorf("server exited with status %d; see %s/server.log", r.procs["server"].ExitCode(), r.o.OutDir)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("server not healthy after 20s; see %s/server.log", r.o.OutDir)
		}
	}
}

// createKey runs tokenctl apikey create; the key (its stdout) is kept in
// memory only, never in the logs.
func (r *run) createKey(ctx context.Context) (string, error) {
	var stdout, stderr bytes.Buffer
	p, err := Start(ProcSpec{Name: "tokenctl", Path: filepath.Join(r.o.BinDir, "tokenctl"), Args: []string{"apikey", "create", "--name", "demo",
		// What the demo does and no more: connect sessions, the resource
		// and events, for its own connections.
		"--scopes", "connect,api:call", "--connections", strings.Join(connections, ",")},
		Env: r.env, Stdout: &stdout, Stderr: &stderr})
	if err != nil {
		return "", err
	}
	select {
	case <-p.Done():
	case <-ctx.Done():
		p.Stop(10 * time.Second)
		return "", ctx.Err()
	}
	key := strings.TrimSpace(stdout.String())
	if code := p.ExitCode(); code != 0 || key == "" || strings.ContainsAny(key, " \n") {
		return "", fmt.Errorf("tokenctl apikey create exited %d: %s", code, strings.TrimSpace(stderr.String()))
	}
	return key, nil
}

// authorized is req with the demo's API key.
func (r *run) authorized(req *http.Request) *http.Request {
	req.Header.Set("Authorization", "Bearer "+r.key)
	return req
}

// demoApp is the application the demo plays: where the browser comes
// back to with the consent's result (never reached: the demo's browser
// stops there and hands the result to the "backend").
const demoApp = "https://app.demo.example/"

var formField = regexp.MustCompile(`name="(session|csrf)" value="([^"]+)"`)

// connectViaBrowserFlow asks for a connect session, then does what a
// browser does with its URL: the consent page, its button (POST with the
// page's CSRF token), the provider (which approves at once), back to
// /oauth/callback carrying the server's cookie, and on to return_to with
// a pending result; the demo's backend then redeems the result.
func (r *run) connectViaBrowserFlow(ctx context.Context, name string) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.server+"/connect-sessions",
		strings.NewReader(`{"connection":"`+name+`","return_to":"`+demoApp+`integrations"}`))
	resp, err := http.DefaultClient.Do(r.authorized(req))
	if err != nil {
		return fmt.Errorf("connect session for %s: %w", name, err)
	}
	var session struct {
		ConnectURL string `json:"connect_url"`
	}
	err = json.NewDecoder(resp.Body).Decode(&session)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || err != nil {
		return fmt.Errorf("connect session for %s: %s", name, resp.Status)
	}
	jar, _ := cookiejar.New(nil)
	app, _ := url.Parse(demoApp)
	c := &http.Client{Jar: jar, Timeout: 15 * time.Second, CheckRedirect: func(req *http.Request, _ []*http.Request) error {
		if req.URL.Host == app.Host {
			return http.ErrUseLastResponse
		}
		return nil
	}}
	page, err := fetch(ctx, c, http.MethodGet, session.ConnectURL, nil)
	if err != nil {
		return fmt.Errorf("connect %s: the consent page: %w", name, err)
	}
	form := url.Values{}
	for _, m := range formField.FindAllStringSubmatch(page.body, -1) {
		form.Set(m[1], m[2])
	}
	back, err := fetch(ctx, c, http.MethodPost, r.server+"/oauth/connect", form)
	if err != nil {
		return fmt.Errorf("connect %s: %w", name, err)
	}
	loc, err := url.Parse(back.location)
	if back.status != http.StatusSeeOther || err != nil || loc.Host != app.Host || loc.Query().Get("status") != "pending" {
		return fmt.Errorf("connect %s: the browser did not come back with a pending result: %d %.200s", name, back.status, back.body)
	}
	req, _ = http.NewRequestWithContext(ctx, http.MethodPost, r.server+"/connect-results",
		strings.NewReader(`{"result":"`+loc.Query().Get("result")+`"}`))
	resp, err = http.DefaultClient.Do(r.authorized(req))
	if err != nil {
		return fmt.Errorf("redeem the result of %s: %w", name, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("redeem the result of %s: %s: %s", name, resp.Status, body)
	}
	r.granted[name] = time.Now()
	return nil
}

// answer is the end of a browser request.
type answer struct {
	status         int
	location, body string
}

func fetch(ctx context.Context, c *http.Client, method, target string, form url.Values) (answer, error) {
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(ctx, method, target, body)
	if err != nil {
		return answer{}, err
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	req.Header.Set("Accept", "text/html")
	resp, err := c.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return answer{status: resp.StatusCode, location: resp.Header.Get("Location"), body: string(b)}, nil
}

// addProvider registers the second sandbox as an operator registers a
// provider: tokenctl provider add, the client secret on stdin (never on
// the command line), the lifetime its answers do not say given as
// --default-lifetime.
func (r *run) addProvider(ctx context.Context) error {
	cfg := r.stored.OAuth2Config(r.stored.URL)
	return r.tool(ctx, "provider-add", strings.NewReader(cfg.ClientSecret+"\n"), "provider", "add", "--name", storedProvider,
		"--token-url", cfg.Endpoint.TokenURL, "--auth-url", cfg.Endpoint.AuthURL, "--client-id", cfg.ClientID,
		"--api-base-url", r.stored.URL, "--default-lifetime", r.o.StoredTokenLifetime.String())
}

// importToken gets a grant from the provider as another tool would and
// pipes it into tokenctl import (--provider when provider is not "").
func (r *run) importToken(ctx context.Context, name, provider string, cfg *oauth2.Config) error {
	tok, err := sandbox.Grant(ctx, cfg)
	if err != nil {
		return err
	}
	js, err := json.Marshal(tok)
	if err != nil {
		return err
	}
	r.granted[name] = time.Now()
	args := []string{"import", "--connection", name}
	if provider != "" {
		args = append(args, "--provider", provider)
	}
	return r.tool(ctx, "import-"+name, bytes.NewReader(js), args...)
}

func (r *run) startWorkerAndBatch() error {
	if err := r.start("worker", nil); err != nil {
		return err
	}
	pr, pw := io.Pipe()
	log, err := r.logFile("batch-rounds")
	if err != nil {
		return err
	}
	go func() {
		defer close(r.batchDone)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			_, _ = log.Write(append(sc.Bytes(), '\n'))
			var round batch.Round
			if json.Unmarshal(sc.Bytes(), &round) != nil {
				continue
			}
			r.rounds.Add(1)
			r.batchOK.Add(int64(round.Succeeded))
			r.batchBad.Add(int64(max(round.Failed, len(round.Errors))))
			r.fails.add("batch", time.Now(), int64(max(round.Failed, len(round.Errors))))
		}
	}()
	if err := r.start("batch", pw, "--every", r.o.BatchEvery.String()); err != nil {
		pw.Close()
		return err
	}
	go func() { <-r.procs["batch"].Done(); pw.Close() }()
	return nil
}

// load drives the server and the worker for the configured duration; it
// returns false if ctx ended it early.
func (r *run) load(ctx context.Context) bool {
	loadCtx, cancel := context.WithTimeout(ctx, r.o.Duration)
	defer cancel()
	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	var wg sync.WaitGroup
	for i := range r.o.Concurrency {
		wg.Go(func() {
			for n := i; loadCtx.Err() == nil; n++ {
				// Requests run on ctx, not loadCtx: the last ones finish
				// and are counted; only Ctrl-C cuts them short.
				if r.callResource(ctx, client, connections[n%len(connections)]) {
					r.serverOK.Add(1)
				} else if ctx.Err() == nil {
					r.serverBad.Add(1)
					r.fails.add("server", time.Now(), 1)
				}
				sleep(loadCtx, 10*time.Millisecond)
			}
		})
	}
	wg.Go(func() {
		t := time.NewTicker(time.Second / time.Duration(r.o.EventsPerSecond))
		defer t.Stop()
		for n := 0; ; n++ {
			select {
			case <-loadCtx.Done():
				return
			case <-t.C:
			}
			if id, ok := r.postEvent(ctx, client, connections[n%len(connections)]); ok {
				r.eventsMu.Lock()
				r.eventIDs = append(r.eventIDs, id)
				r.eventsMu.Unlock()
			} else if ctx.Err() == nil {
				r.enqBad.Add(1)
				r.fails.add("server", time.Now(), 1)
			}
		}
	})
	start := time.Now()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for n := 1; ; n++ {
		select {
		case <-loadCtx.Done():
			wg.Wait()
			if r.o.Live {
				fmt.Fprintln(r.out)
			}
			return ctx.Err() == nil
		case <-tick.C:
			line := r.progress(ctx, time.Since(start))
			if r.o.Live {
				fmt.Fprintf(r.out, "\r%s\033[K", line)
			} else if n%5 == 0 {
				fmt.Fprintln(r.out, line)
			}
		}
	}
}

func (r *run) callResource(ctx context.Context, c *http.Client, name string) bool {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.server+"/connections/"+name+"/resource", nil)
	resp, err := c.Do(r.authorized(req))
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode == http.StatusOK
}

func (r *run) postEvent(ctx context.Context, c *http.Client, name string) (int64, bool) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.server+"/connections/"+name+"/events",
		strings.NewReader(`{"source":"demo"}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(r.authorized(req))
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	var body struct {
		EventID int64 `json:"event_id"`
	}
	if resp.StatusCode != http.StatusAccepted || json.NewDecoder(resp.Body).Decode(&body) != nil {
		return 0, false
	}
	return body.EventID, true
}

// queueState counts the demo's events by outcome, from River's table.
func (r *run) queueState(ctx context.Context) (processed, retried, pending int64, err error) {
	r.eventsMu.Lock()
	ids := append([]int64(nil), r.eventIDs...)
	r.eventsMu.Unlock()
	err = r.db.QueryRow(ctx, `
SELECT count(*) FILTER (WHERE state = 'completed'),
       coalesce(sum(coalesce(array_length(errors, 1), 0)), 0),
       count(*) FILTER (WHERE state <> 'completed')
FROM river_job WHERE id = ANY($1)`, ids).Scan(&processed, &retried, &pending)
	// pending: not completed yet, or not even in the table.
	return processed, retried, int64(len(ids)) - processed, err
}

func (r *run) progress(ctx context.Context, elapsed time.Duration) string {
	a, b := r.sb.Stats(), r.stored.Stats()
	processed, retried, _, _ := r.queueState(ctx)
	r.eventsMu.Lock()
	enq := len(r.eventIDs)
	r.eventsMu.Unlock()
	return fmt.Sprintf("%3.0fs  server %d ok/%d failed · worker %d/%d events, %d retried · batch %d ok/%d failed · refreshes %d+%d · reuse %d+%d · 401s %d+%d",
		elapsed.Seconds(), r.serverOK.Load(), r.serverBad.Load()+r.enqBad.Load(), processed, enq, retried,
		r.batchOK.Load(), r.batchBad.Load(), a.Refreshes, b.Refreshes, a.RefreshReuse, b.RefreshReuse, a.Resource401, b.Resource401)
}

// drain waits (up to 20s) for the worker to finish the events enqueued.
func (r *run) drain(ctx context.Context) {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if _, _, pending, err := r.queueState(ctx); err == nil && pending == 0 {
			return
		}
		sleep(ctx, 200*time.Millisecond)
	}
}

// stopAll sends SIGTERM to every app still running, at once, and records
// how each exited. Safe to call twice.
func (r *run) stopAll(rep *Report) {
	// Which apps to stop is decided before any stop is recorded: the
	// goroutines write rep.Shutdown.
	running := map[string]*Proc{}
	for name, p := range r.procs {
		if _, done := rep.Shutdown[name]; !done {
			running[name] = p
		}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, p := range running {
		wg.Go(func() {
			s := p.Stop(10 * time.Second)
			mu.Lock()
			rep.Shutdown[name] = s
			mu.Unlock()
		})
	}
	wg.Wait()
}

func (r *run) finish(rep *Report, loadStart, loadEnd time.Time) {
	if p, ok := r.procs["batch"]; ok {
		<-p.Done()
		<-r.batchDone
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	processed, retried, lost, err := r.queueState(ctx)
	if err != nil {
		rep.Problems = append(rep.Problems, "could not read the queue: "+err.Error())
	}
	r.eventsMu.Lock()
	rep.Events = EventReport{Enqueued: int64(len(r.eventIDs)), Processed: processed, Retried: retried, Lost: lost}
	r.eventsMu.Unlock()
	if rep.Interrupted {
		rep.Events.Unfinished, rep.Events.Lost, lost = lost, 0, 0
	}
	calls := map[string]int64{}
	rep.Providers = nil
	for _, p := range r.provs {
		pr := p.report(r.granted, r.o.Skew, loadStart, loadEnd)
		rep.Providers = append(rep.Providers, pr)
		for agent, n := range pr.ByAgent {
			calls[agent] += n
		}
	}
	rep.Apps["server"] = AppReport{
		Calls: calls["tokenguard-server"], Failures: r.serverBad.Load() + r.enqBad.Load(),
		Detail: fmt.Sprintf("%d requests answered 200, %d events accepted", r.serverOK.Load(), rep.Events.Enqueued),
	}
	rep.Apps["worker"] = AppReport{
		Calls: calls["tokenguard-worker"], Failures: retried + lost,
		Detail: fmt.Sprintf("%d/%d events processed", processed, rep.Events.Enqueued),
	}
	rep.Apps["batch"] = AppReport{
		Calls: calls["tokenguard-batch"], Failures: r.batchBad.Load(),
		Detail: fmt.Sprintf("%d rounds", r.rounds.Load()),
	}
	for _, name := range []string{"server", "worker", "batch"} {
		if f := rep.Apps[name].Failures; f > 0 {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s: %d failed calls (see %s/%s.log)", name, f, r.o.OutDir, name))
		}
		if s, ok := rep.Shutdown[name]; ok && (s.ExitCode != 0 || s.Killed) {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s: exit status %d after SIGTERM (killed: %t)", name, s.ExitCode, s.Killed))
		}
	}
	for _, p := range rep.Providers {
		rep.Problems = append(rep.Problems, p.problems()...)
	}
	if rep.Interrupted {
		rep.Problems = append(rep.Problems, "interrupted")
	}
	rep.OK = len(rep.Problems) == 0
}

// statusTable prints what tokenctl status says at the end.
func (r *run) statusTable() error {
	var out, stderr bytes.Buffer
	p, err := Start(ProcSpec{Name: "tokenctl", Path: filepath.Join(r.o.BinDir, "tokenctl"), Args: []string{"status"},
		Env: r.env, Stdout: &out, Stderr: &stderr})
	if err != nil {
		return err
	}
	if code := p.Wait(); code != 0 {
		return fmt.Errorf("exit %d: %s", code, strings.TrimSpace(stderr.String()))
	}
	r.say("\n$ bin/tokenctl status")
	_, _ = io.Copy(r.out, &out)
	return nil
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func redact(u string) string {
	if i := strings.Index(u, "://"); i >= 0 {
		if j := strings.Index(u[i+3:], "@"); j >= 0 {
			return u[:i+3] + "…@" + u[i+3+j+1:]
		}
	}
	return u
}

// WriteJSON writes the report to path.
func (rep *Report) WriteJSON(path string) error {
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(js, '\n'), 0o644)
}

// timeline gathers the run second by second: the provider's counts per
// app, the failures seen, and the refreshes each app logged.
func (r *run) timeline(end time.Time) (*Timeline, error) {
	apps := []string{"server", "worker", "batch"}
	t := &Timeline{End: end.UTC()}
	for _, at := range r.granted {
		if t.Start.IsZero() || at.Before(t.Start) {
			t.Start = at.UTC()
		}
	}
	// Failed attempts of the worker's events, from River's table.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r.eventsMu.Lock()
	ids := append([]int64(nil), r.eventIDs...)
	r.eventsMu.Unlock()
	rows, err := r.db.Query(ctx, `SELECT (e->>'at')::timestamptz FROM river_job j, unnest(j.errors) e WHERE j.id = ANY($1)`, ids)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var at time.Time
		if err := rows.Scan(&at); err != nil {
			rows.Close()
			return nil, err
		}
		r.fails.add("worker", at, 1)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	pids := map[string]int{}
	for _, app := range apps {
		if p, ok := r.procs[app]; ok {
			pids[app] = p.Pid()
		}
		f, err := os.Open(filepath.Join(r.o.OutDir, app+".log"))
		if err != nil {
			return nil, err
		}
		marks, err := ParseRefreshLog(f)
		f.Close()
		if err != nil {
			return nil, err
		}
		t.Refreshes = append(t.Refreshes, marks...)
	}
	sortMarks(t.Refreshes)
	var resource []sandbox.ResourceSecond
	lifetimes := map[string]time.Duration{}
	for _, p := range r.provs {
		resource = append(resource, p.sb.Timeline().Resource...)
		for _, name := range p.conns {
			lifetimes[name] = p.lifetime
		}
	}
	t.Lanes = r.fails.lanes(apps, pids, resource)
	t.Tokens = TokenBands(r.granted, t.Refreshes, lifetimes)
	return t, nil
}
