// Package soak runs tokenguard for a long time under many faults at once
// and checks its invariants the whole time: the server, worker and batch
// apps as OS processes under load, against the sandbox provider with
// short-lived tokens, on a throw-away Postgres cluster of its own (so it
// can restart it), while a fault injector slows the provider, makes it
// fail or hang, ends the apps' database sessions, kills and restarts the
// apps, restarts Postgres and stalls the apps' LISTEN sessions. cmd/soak
// (make soak) drives it.
package soak

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokenguard/tokenguard/internal/pgserver"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/tools/internal/demo"
)

// Options configure a soak. Zero values take the defaults.
type Options struct {
	BinDir          string        // the built apps (default "bin")
	OutDir          string        // logs and report.json (default "soak-out")
	Duration        time.Duration // fault phase (default 10m)
	TokenLifetime   time.Duration // sandbox access-token lifetime (default 4s)
	Skew            time.Duration // TOKEN_REFRESH_SKEW (default 1s)
	FaultGap        time.Duration // mean time between faults (default 8s)
	Concurrency     int           // concurrent HTTP clients of the server (default 4)
	EventsPerSecond int           // events posted to the server (default 10)
	Seed            uint64        // fault schedule (0: from the clock; the report names it)
	// Control adds the two faults no client survives against a strict
	// provider, to show the invariants catch them: kill -9 inside the
	// rotation window, and a provider that answers only after the client
	// gave up (TOKEN_REFRESH_TIMEOUT). A control run is expected to fail.
	Control bool
	// Failover, when FailoverSync or FailoverAsync, runs the failover
	// soak instead: the apps on a primary and a streaming standby
	// (synchronous or not) behind one DSN, and Failovers failovers
	// FaultGap apart on average, no other fault. Duration is then unused.
	Failover  string
	Failovers int // default 10
}

func (o Options) withDefaults() Options {
	if o.BinDir == "" {
		o.BinDir = "bin"
	}
	if o.OutDir == "" {
		o.OutDir = "soak-out"
	}
	if o.Duration <= 0 {
		o.Duration = 10 * time.Minute
	}
	if o.TokenLifetime <= 0 {
		o.TokenLifetime = 4 * time.Second
	}
	if o.Skew <= 0 {
		o.Skew = time.Second
	}
	if o.FaultGap <= 0 {
		o.FaultGap = 8 * time.Second
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 4
	}
	if o.EventsPerSecond <= 0 {
		o.EventsPerSecond = 10
	}
	if o.Failovers <= 0 {
		o.Failovers = 10
	}
	if o.Seed == 0 {
		o.Seed = uint64(time.Now().UnixNano())
	}
	return o
}

// The apps' refresh bound. The slow-provider fault stays below it: a
// provider that answers after the client gave up has rotated a token
// nobody receives, which is the lost-response case of the rotation window
// (docs/design.md), not something a client can survive against a strict provider.
// It reaches 2.6 s, well past a refresh lease's renewal term (1 s): the
// lease of a call that slow holds only by its bound and its renewals.
//
// answerDeadline (TOKEN_ANSWER_DEADLINE) is short so that hangs outlast it
// within a soak: a provider frozen for less is answered, its queue stored;
// a hang past it is a lost answer.
const (
	refreshTimeout = 3 * time.Second
	answerDeadline = 8 * time.Second
	maxLatency     = 2600 * time.Millisecond
)

var connections = []string{"acme", "globex", "initech", dpopConnection}

var appNames = []string{"server", "worker", "batch"}

// soak is one run's state.
type soak struct {
	o      Options
	out    io.Writer
	rng    *rand.Rand
	start  time.Time
	pg     *pgserver.Server
	pair   *pgserver.Pair // the failover soak's cluster
	dbURL  string
	dbName string
	sb     *sandbox.Provider
	sbURL  string
	server string // base URL of the server app
	key    string // its API key (tokenctl apikey create)
	env    []string
	gate   *gate
	apps   map[string]*app
	calls  *calls
	events *events
	faults *faultLog
	checks *checks
	logs   *logCounts

	versions *versionLog
	hooks    *hooks
	fo       *failoverLog
}

// Run runs the soak and returns its report; the error is for runs that
// could not start.
func Run(ctx context.Context, o Options, out io.Writer) (*Report, error) {
	o = o.withDefaults()
	s := &soak{o: o, out: out, rng: rand.New(rand.NewPCG(o.Seed, o.Seed^0x9e3779b97f4a7c15)),
		gate: &gate{inFlight: map[string]int{}, lastDone: map[string]time.Time{}, rescues: map[string]int{}, open: o.Control}, apps: map[string]*app{}, calls: &calls{}, events: &events{},
		faults: &faultLog{}, checks: &checks{}, logs: &logCounts{}, versions: &versionLog{}, hooks: &hooks{}, fo: &failoverLog{}}
	for _, name := range []string{"tokenctl", "server", "worker", "batch"} {
		if _, err := os.Stat(filepath.Join(o.BinDir, name)); err != nil {
			return nil, fmt.Errorf("%s/%s is missing: run make build first", o.BinDir, name)
		}
	}
	if err := os.MkdirAll(o.OutDir, 0o755); err != nil {
		return nil, err
	}
	switch o.Failover {
	case "":
		s.say("tokenguard soak: %s of faults, access tokens live %s, seed %d", o.Duration, o.TokenLifetime, o.Seed)
	case FailoverSync, FailoverAsync:
		s.say("tokenguard failover soak: %d failovers to a %s standby, %s apart on average, access tokens live %s, seed %d",
			o.Failovers, map[string]string{FailoverSync: "synchronous", FailoverAsync: "asynchronous"}[o.Failover], o.FaultGap, o.TokenLifetime, o.Seed)
	default:
		return nil, fmt.Errorf("failover mode %q: want %s or %s", o.Failover, FailoverSync, FailoverAsync)
	}
	if o.Control {
		s.say("  CONTROL run: kills inside the rotation window, provider answers after %s; invariants are expected to fail", answerDeadline)
	}

	var err error
	if o.Failover != "" {
		if err := s.startPair(ctx); err != nil {
			return nil, err
		}
		defer s.pair.Close()
	} else {
		if s.pg, err = pgserver.StartCluster(ctx, ""); err != nil {
			return nil, fmt.Errorf("throw-away Postgres cluster: %w", err)
		}
		defer s.pg.Close()
		if s.dbURL, _, err = pgserver.CreateDatabase(ctx, s.pg.URL, "tokenguard_soak"); err != nil {
			return nil, err
		}
		s.say("  postgres:  throw-away cluster (local initdb) at %s, removed at the end", s.pg.URL)
	}

	stopSandbox, err := s.startSandbox()
	if err != nil {
		return nil, err
	}
	defer stopSandbox()
	s.say("  provider:  sandbox at %s (strict rotation, reuse revokes the grant)", s.sbURL)

	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	s.server = "http://" + addr
	cfg := s.sb.OAuth2Config(s.sbURL)
	s.env = demo.Env(
		"DATABASE_URL="+s.dbURL,
		"OAUTH_CLIENT_ID="+cfg.ClientID,
		"OAUTH_CLIENT_SECRET="+cfg.ClientSecret,
		"OAUTH_TOKEN_URL="+cfg.Endpoint.TokenURL,
		"OAUTH_AUTH_URL="+cfg.Endpoint.AuthURL,
		"OAUTH_REDIRECT_URL="+s.server+"/oauth/callback",
		"OAUTH_SCOPES="+strings.Join(cfg.Scopes, ","),
		"API_BASE_URL="+s.sbURL,
		"HTTP_ADDR="+addr,
		"TOKEN_REFRESH_SKEW="+o.Skew.String(),
		"TOKEN_LOCK_WAIT=5s",
		"TOKEN_REFRESH_TIMEOUT="+refreshTimeout.String(),
		"TOKEN_ANSWER_DEADLINE="+answerDeadline.String(),
		"API_TIMEOUT=5s",
		"WORKER_JOB_TIMEOUT=10s",
		"LOG_LEVEL=info",
		"LOG_FORMAT=json",
		// One key drives all the load.
		"API_KEY_RATE=100000",
		"API_KEY_BURST=100000",
	)
	if o.Failover != "" {
		hookURL, stopHooks, err := s.hooks.serve()
		if err != nil {
			return nil, err
		}
		defer stopHooks()
		s.env = append(s.env, "WEBHOOK_URL="+hookURL, "WEBHOOK_SECRET=soak-webhook-secret-0123456789")
	}

	if _, err := s.tokenctl(ctx, nil, "migrate"); err != nil {
		return nil, err
	}
	key, err := s.tokenctl(ctx, nil, "apikey", "create", "--name", "soak")
	if err != nil {
		return nil, err
	}
	s.key = strings.TrimSpace(key)
	for _, name := range connections {
		if err := s.importGrant(ctx, name); err != nil {
			return nil, err
		}
	}
	if err := s.query(ctx, func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, auditRotations)
		return err
	}); err != nil {
		return nil, fmt.Errorf("audit trigger: %w", err)
	}
	s.say("  imported:  %s (tokenctl import; %s bound to a DPoP key)", strings.Join(connections, ", "), dpopConnection)

	defer s.stopApps()
	for _, name := range appNames {
		if err := s.startApp(ctx, name); err != nil {
			return nil, err
		}
	}
	s.say("  apps:      server, worker, batch --every 1s; logs in %s/", o.OutDir)
	s.say("")

	s.start = time.Now()
	rep := &Report{StartedAt: s.start.UTC(), Seed: o.Seed, Control: o.Control, Duration: o.Duration.String(), TokenLifetime: o.TokenLifetime.String(), FailoverMode: o.Failover}
	faultCtx, stopFaults := context.WithTimeout(ctx, o.Duration)
	if o.Failover != "" {
		faultCtx, stopFaults = context.WithCancel(ctx)
	}
	defer stopFaults()
	var wg sync.WaitGroup
	wg.Go(func() { s.load(faultCtx) })
	if o.Failover != "" {
		rep.Duration = fmt.Sprintf("%d failovers", o.Failovers)
		wg.Go(func() { s.failovers(faultCtx); stopFaults() })
	} else {
		wg.Go(func() { s.inject(faultCtx) })
	}
	wg.Go(func() { s.watch(faultCtx) })
	wg.Go(func() { s.progress(faultCtx) })
	wg.Wait()
	rep.Interrupted = ctx.Err() != nil
	faultEnd := time.Now()

	// Faults are over: every app must be up, every event done.
	s.clearProviderFaults()
	if ctx.Err() == nil {
		s.say("faults stopped after %s; bringing every app up and draining the queue", faultEnd.Sub(s.start).Round(time.Second))
		for _, name := range appNames {
			if !s.apps[name].running() {
				if err := s.startApp(ctx, name); err != nil {
					rep.Problems = append(rep.Problems, fmt.Sprintf("%s does not start again: %v", name, err))
				}
			}
		}
		rep.Hastened = s.drain(ctx)
	}
	s.stopApps()
	s.check(context.Background()) // the final word on reuse and needs_reauth
	s.finish(ctx, rep, faultEnd)
	if err := rep.writeJSON(filepath.Join(o.OutDir, "report.json")); err != nil {
		rep.Problems = append(rep.Problems, "report.json: "+err.Error())
	}
	rep.OK = rep.OK && len(rep.Problems) == 0
	return rep, nil
}

func (s *soak) say(format string, a ...any) { fmt.Fprintf(s.out, format+"\n", a...) }

// since is the offset from the start of the fault phase.
func (s *soak) since(t time.Time) time.Duration { return t.Sub(s.start).Round(100 * time.Millisecond) }

// startSandbox serves the provider behind the gate, which follows each
// app's token requests.
func (s *soak) startSandbox() (func(), error) {
	p, err := sandbox.New(sandbox.Options{AccessTokenLifespan: s.o.TokenLifetime, RedirectURIs: []string{"*"}})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: s.gate.wrap(p.Handler()), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	s.sb, s.sbURL = p, "http://"+ln.Addr().String()
	return func() { _ = srv.Close() }, nil
}

// startPair starts the failover soak's primary and standby and creates
// the soak database, which the apps reach through a DSN naming both.
func (s *soak) startPair(ctx context.Context) error {
	var err error
	if s.pair, err = pgserver.StartPair(ctx, s.o.Failover == FailoverSync); err != nil {
		return fmt.Errorf("throw-away primary and standby: %w", err)
	}
	u, _, err := pgserver.CreateDatabase(ctx, s.pair.PrimaryURL(), "tokenguard_soak")
	if err != nil {
		return err
	}
	s.dbName = u[strings.LastIndex(u, "/")+1:]
	if i := strings.IndexByte(s.dbName, '?'); i >= 0 {
		s.dbName = s.dbName[:i]
	}
	s.dbURL = s.pair.URL(s.dbName)
	s.say("  postgres:  throw-away primary and %s standby (initdb, pg_basebackup -R), removed at the end", s.o.Failover)
	s.say("             apps connect to %s", s.dbURL)
	return nil
}

// tokenctl runs bin/tokenctl to completion and returns its output.
func (s *soak) tokenctl(ctx context.Context, stdin io.Reader, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	p, err := demo.Start(demo.ProcSpec{Name: "tokenctl", Path: filepath.Join(s.o.BinDir, "tokenctl"), Args: args,
		Env: s.env, Stdin: stdin, Stdout: &stdout, Stderr: &stderr})
	if err != nil {
		return "", err
	}
	select {
	case <-p.Done():
	case <-ctx.Done():
		p.Kill()
		return "", ctx.Err()
	}
	if code := p.ExitCode(); code != 0 {
		return "", fmt.Errorf("tokenctl %s exited %d: %s", args[0], code, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// query runs fn on a fresh connection to the soak database (the database
// restarts under the driver too), bounded by a few seconds.
func (s *soak) query(ctx context.Context, fn func(context.Context, *pgx.Conn) error) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cfg, err := pgx.ParseConfig(s.dbURL)
	if err != nil {
		return err
	}
	cfg.RuntimeParams["application_name"] = "tokenguard-soak"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return fn(ctx, conn)
}

// auditRotations records, in the transaction that stores it, every new
// refresh token written over an old one: the rotations the apps stored.
// A save that only marks needs_reauth keeps the refresh token and is not
// one. The soak database is the driver's own; the apps never read this.
const auditRotations = `
CREATE TABLE soak_rotations (
    at            timestamptz NOT NULL DEFAULT clock_timestamp(),
    connection_id integer     NOT NULL,
    version       bigint      NOT NULL
);
CREATE FUNCTION soak_rotation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.refresh_token IS DISTINCT FROM OLD.refresh_token THEN
        INSERT INTO soak_rotations (connection_id, version) VALUES (NEW.connection_id, NEW.version);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER soak_rotation AFTER UPDATE ON tokenguard_tokens FOR EACH ROW EXECUTE FUNCTION soak_rotation();
`

// drain waits for every accepted event to complete. Events waiting for a
// retry (River backs off by attempt⁴ seconds) are made due now; it returns
// how many were.
func (s *soak) drain(ctx context.Context) int64 {
	ids := s.events.ids()
	var hastened int64
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		var pending int64
		err := s.query(ctx, func(ctx context.Context, c *pgx.Conn) error {
			tag, err := c.Exec(ctx, `UPDATE river_job SET scheduled_at = now()
WHERE id = ANY($1) AND state IN ('retryable', 'scheduled') AND scheduled_at > now()`, ids)
			if err != nil {
				return err
			}
			hastened += tag.RowsAffected()
			var done int64
			if err := c.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE id = ANY($1) AND state = 'completed'`, ids).Scan(&done); err != nil {
				return err
			}
			pending = int64(len(ids)) - done
			return nil
		})
		if err == nil && pending == 0 {
			return hastened
		}
		sleep(ctx, 500*time.Millisecond)
	}
	return hastened
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

// lines calls fn with each complete line written to it.
type lines struct {
	mu  sync.Mutex
	buf []byte
	fn  func(string)
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		l.fn(string(l.buf[:i]))
		l.buf = l.buf[i+1:]
	}
}
