// Package scalebench is make bench-scale: a fleet of app processes on one
// Postgres with a table of up to millions of connections. It seeds the
// table (COPY), starts N processes that each touch a random working set
// and then serve it while a set of connections is refreshed in waves
// against the sandbox provider, and reports per-process memory and
// start-up time against the table size, refreshes per second (and reuse,
// which must be 0), Postgres connections in use, NOTIFY delivery lag, and
// one proactive sweep's rate against its ceiling, for a bounded and an
// unbounded token cache side by side. It is benchmark tooling, never
// linked by the apps.
package scalebench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/oauth2"
	"golang.org/x/sync/errgroup"
	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/infra/postgres"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/internal/pgserver"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/migrations"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/tools/internal/demo"
	"github.com/tokenguard/tokenguard/usecase"
)

// Options of a benchmark.
type Options struct {
	AdminURL   string        // server to create the databases on
	Sizes      []int         // table sizes, rows
	Caches     []int         // TOKEN_CACHE_SIZE values compared
	Procs      int           // app processes
	WorkingSet int           // distinct connections each process touches
	Wave       int           // connections refreshed during the run
	Lifetime   time.Duration // their access tokens' lifetime
	Run        time.Duration // how long the fleet serves after touching
	Workers    int           // goroutines per process calling Token
	Rate       int           // Token calls per second per process while serving
	Latency    time.Duration // the provider's refresh latency
	SweepConc  int           // concurrency of the proactive sweep
	RSSBoundMB int           // fail if a bounded-cache process exceeds it (0: no check)
	BoundedMax int           // a cache size up to which RSSBoundMB applies
	Self       string        // this executable, run with "child"
}

// Result of one run: one table size, one cache size.
type Result struct {
	Rows, Cache                    int
	SeedS                          float64
	StartupMS                      []float64
	TouchedRSSMB, DoneRSSMB, HWMMB []float64
	HeapMB                         []float64
	TouchS                         []float64
	Calls, Errors                  int64
	FirstError                     string
	Refreshes, Reuse, Rejected     int64
	RefreshPerS                    float64
	PGConnsMax, PGConnsMean        float64
	LagP50MS, LagP99MS             float64 // worst process's
	Lags                           int
	SweepDue, SweepRefreshed       int
	SweepPerS, SweepCeiling        float64
	StatusLines                    int64   // tokenctl status: lines printed,
	StatusS, StatusHWMMB           float64 // its time and peak RSS
}

// RunAll runs every size × cache combination and writes a table to out.
func RunAll(ctx context.Context, o Options, out io.Writer) ([]Result, error) {
	var res []Result
	for _, rows := range o.Sizes {
		for _, cache := range o.Caches {
			fmt.Fprintf(out, "run: %d rows, TOKEN_CACHE_SIZE=%d, %d processes\n", rows, cache, o.Procs)
			r, err := run(ctx, o, rows, cache, out)
			if err != nil {
				return res, fmt.Errorf("%d rows, cache %d: %w", rows, cache, err)
			}
			res = append(res, r)
			writeJSON(out, r)
		}
	}
	return res, nil
}

func writeJSON(out io.Writer, v any) {
	b, _ := json.Marshal(v)
	fmt.Fprintf(out, "result: %s\n", b)
}

func run(ctx context.Context, o Options, rows, cache int, out io.Writer) (Result, error) {
	res := Result{Rows: rows, Cache: cache}
	dbURL, drop, err := pgserver.CreateDatabase(ctx, o.AdminURL, "tokenguard_scale")
	if err != nil {
		return res, err
	}
	defer func() { _ = drop(context.Background()) }()
	if err := migrations.Up(dbURL); err != nil {
		return res, err
	}
	start := time.Now()
	if err := seed(ctx, dbURL, rows); err != nil {
		return res, fmt.Errorf("seed: %w", err)
	}
	res.SeedS = time.Since(start).Seconds()
	fmt.Fprintf(out, "  seeded %d rows in %.1fs\n", rows, res.SeedS)

	if err := status(dbURL, o.Self, &res); err != nil {
		return res, err
	}
	fmt.Fprintf(out, "  tokenctl status: %d lines in %.1fs, peak RSS %.0f MiB\n", res.StatusLines, res.StatusS, res.StatusHWMMB)

	sb, err := demo.StartSandbox("127.0.0.1:0", sandbox.Options{AccessTokenLifespan: o.Lifetime, RefreshLatency: o.Latency})
	if err != nil {
		return res, err
	}
	defer sb.Close()
	oc := sb.OAuth2Config(sb.URL)
	wave := min(o.Wave, rows/2)
	env := append(os.Environ(),
		"DATABASE_URL="+dbURL,
		"OAUTH_CLIENT_ID="+oc.ClientID, "OAUTH_CLIENT_SECRET="+oc.ClientSecret, "OAUTH_TOKEN_URL="+oc.Endpoint.TokenURL,
		"TOKEN_CACHE_SIZE="+strconv.Itoa(cache), "MIGRATE_ON_START=false", "DB_MAX_CONNS=10",
		"TOKEN_REFRESH_SKEW="+(o.Lifetime/6).String(), "TOKEN_LOCK_WAIT=15s", "TOKEN_REFRESH_TIMEOUT=10s",
		envRows+"="+strconv.Itoa(rows), envWave+"="+strconv.Itoa(wave),
		envWS+"="+strconv.Itoa(min(o.WorkingSet, rows-wave)), envWorkers+"="+strconv.Itoa(o.Workers), envRate+"="+strconv.Itoa(o.Rate),
	)

	// The fleet.
	procs := make([]*child, o.Procs)
	for i := range procs {
		c, err := startChild(o.Self, append(slices.Clone(env), envSeed+"="+strconv.Itoa(i+1)), "child")
		if err != nil {
			return res, err
		}
		defer c.kill()
		procs[i] = c
	}
	for _, c := range procs {
		r, err := c.await("ready", 5*time.Minute)
		if err != nil {
			return res, err
		}
		res.StartupMS = append(res.StartupMS, r.StartupMS)
	}
	fmt.Fprintf(out, "  %d processes ready (start-up %s ms)\n", len(procs), spread(res.StartupMS))
	for _, c := range procs {
		r, err := c.await("touched", 30*time.Minute)
		if err != nil {
			return res, err
		}
		res.TouchedRSSMB = append(res.TouchedRSSMB, float64(r.RSSKB)/1024)
		res.HeapMB = append(res.HeapMB, r.HeapMB)
		res.TouchS = append(res.TouchS, r.TouchS)
	}
	fmt.Fprintf(out, "  working sets touched (RSS %s MB, heap %s MB)\n", spread(res.TouchedRSSMB), spread(res.HeapMB))

	// The waves: the refreshed connections get real grants in three
	// bursts a third of a lifetime apart; each then expires, and is
	// refreshed, in its burst's rhythm.
	db, err := postgres.Open(ctx, dbURL, postgres.Pool{MaxOpenConns: 16}, repository.NewLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		return res, err
	}
	defer func() { _ = postgres.Close(db) }()
	connect := usecase.NewConnectUseCase(repository.NewTokenRepository(db, tokencrypt.Plaintext{}), nil, 15*time.Second)
	sampleCtx, stopSampling := context.WithCancel(ctx)
	var conns []int
	var sampling sync.WaitGroup
	sampling.Go(func() { conns = sampleConnections(sampleCtx, o.AdminURL, dbName(dbURL)) })
	sampling.Go(func() { probe(sampleCtx, dbURL) })
	sb.ResetStats()
	runStart := time.Now()
	for b := range 3 {
		lo, hi := b*wave/3, (b+1)*wave/3
		if err := grant(ctx, connect, oc, lo, hi); err != nil {
			stopSampling()
			return res, fmt.Errorf("grant wave %d: %w", b, err)
		}
		if b < 2 {
			time.Sleep(max(0, time.Until(runStart.Add(time.Duration(b+1)*o.Lifetime/3))))
		}
	}
	time.Sleep(max(0, time.Until(runStart.Add(o.Run))))
	st := sb.Stats()
	elapsed := time.Since(runStart)
	stopSampling()
	sampling.Wait()
	res.Refreshes, res.Reuse, res.Rejected = st.Refreshes, st.RefreshReuse, st.RefreshRejected
	res.RefreshPerS = float64(st.Refreshes) / elapsed.Seconds()
	res.PGConnsMax, res.PGConnsMean = maxMean(conns)

	for _, c := range procs {
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, c := range procs {
		r, err := c.await("done", 2*time.Minute)
		if err != nil {
			return res, err
		}
		res.DoneRSSMB = append(res.DoneRSSMB, float64(r.RSSKB)/1024)
		res.HWMMB = append(res.HWMMB, float64(r.HWMKB)/1024)
		res.Calls += r.Calls
		res.Errors += r.Errors
		if res.FirstError == "" {
			res.FirstError = r.FirstErr
		}
		res.Lags += r.Lags
		res.LagP50MS, res.LagP99MS = max(res.LagP50MS, r.LagP50MS), max(res.LagP99MS, r.LagP99MS)
		_ = c.cmd.Wait()
	}
	fmt.Fprintf(out, "  served %d calls (%d errors), %d refreshes (%.0f/s, reuse %d), NOTIFY lag p99 %.1f ms\n",
		res.Calls, res.Errors, res.Refreshes, res.RefreshPerS, res.Reuse, res.LagP99MS)

	// One proactive sweep over the wave, the fleet stopped: everything
	// due within a lifetime is refreshed.
	if err := sweep(ctx, db, oc, o, &res); err != nil {
		return res, err
	}
	fmt.Fprintf(out, "  sweep: %d of %d due refreshed, %.0f connections/s (ceiling %.0f/s)\n",
		res.SweepRefreshed, res.SweepDue, res.SweepPerS, res.SweepCeiling)
	return res, nil
}

// status runs tokenctl status over the whole table in a process of its own.
func status(dbURL, self string, res *Result) error {
	c, err := startChild(self, append(os.Environ(), "DATABASE_URL="+dbURL), "status")
	if err != nil {
		return err
	}
	defer c.kill()
	r, err := c.await("status", 10*time.Minute)
	if err != nil {
		return err
	}
	res.StatusLines, res.StatusS, res.StatusHWMMB = r.Calls, r.TouchS, float64(r.HWMKB)/1024
	return c.cmd.Wait()
}

// seed writes rows connections with tokens that stay valid for a day
// (never refreshed): the names by COPY, the tokens by one INSERT ... SELECT.
func seed(ctx context.Context, dbURL string, rows int) error {
	c, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer c.Close(context.WithoutCancel(ctx))
	i := 0
	if _, err := c.CopyFrom(ctx, pgx.Identifier{"tokenguard_connections"}, []string{"name"}, pgx.CopyFromFunc(func() ([]any, error) {
		if i == rows {
			return nil, nil
		}
		i++
		return []any{Name(i - 1)}, nil
	})); err != nil {
		return err
	}
	_, err = c.Exec(ctx, `INSERT INTO tokenguard_tokens (connection_id, access_token, refresh_token, expiry, obtained_at, version, status)
		SELECT id, 'seeded-at-' || id, 'seeded-rt-' || id, now() + interval '1 day' + (id % 3600) * interval '1 second', now(), 1, 'active'
		FROM tokenguard_connections`)
	if err != nil {
		return err
	}
	_, err = c.Exec(ctx, "ANALYZE tokenguard_connections; ANALYZE tokenguard_tokens")
	return err
}

// grant stores a real sandbox grant for connections lo..hi-1.
func grant(ctx context.Context, connect *usecase.ConnectUseCase, cfg *oauth2.Config, lo, hi int) error {
	var g errgroup.Group
	g.SetLimit(16)
	for i := lo; i < hi; i++ {
		g.Go(func() error {
			tok, err := sandbox.Grant(ctx, cfg)
			if err != nil {
				return err
			}
			_, err = connect.Connect(ctx, Name(i), provider.GrantFrom(tok))
			return err
		})
	}
	return g.Wait()
}

// sweep runs one RefreshAhead over everything due within a lifetime, and
// its ceiling: the sweep's concurrency over the provider's mean latency,
// what it would reach if each connection cost only the provider's answer.
func sweep(ctx context.Context, db *gorm.DB, oc *oauth2.Config, o Options, res *Result) error {
	obs := &latencies{}
	refresher := provider.Only(provider.NewRefresher(oc, provider.NewHTTPClient(10*time.Second)))
	uc, err := usecase.NewRefreshTokenUseCase(repository.NewTokenRepository(db, tokencrypt.Plaintext{}), refresher,
		usecase.Options{Observer: obs, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	start := time.Now()
	rep, err := uc.RefreshAhead(ctx, repository.NewTokenRepository(db, tokencrypt.Plaintext{}), o.Lifetime, o.SweepConc)
	elapsed := time.Since(start)
	if err != nil {
		return fmt.Errorf("sweep: %w", err)
	}
	res.SweepDue, res.SweepRefreshed = rep.Due, rep.Refreshed
	res.SweepPerS = float64(rep.Refreshed) / elapsed.Seconds()
	if m := obs.mean(); m > 0 {
		res.SweepCeiling = float64(o.SweepConc) / m.Seconds()
	}
	return nil
}

type latencies struct {
	n   atomic.Int64
	sum atomic.Int64
}

func (l *latencies) CacheLookup(bool) {}
func (l *latencies) Refreshed(e usecase.RefreshEvent) {
	if e.Outcome == usecase.OutcomeOK {
		l.n.Add(1)
		l.sum.Add(int64(e.ProviderLatency))
	}
}
func (l *latencies) ForcedRefresh(string) {}
func (l *latencies) Invalidated()         {}
func (l *latencies) mean() time.Duration {
	if n := l.n.Load(); n > 0 {
		return time.Duration(l.sum.Load() / n)
	}
	return 0
}

// sampleConnections counts the database's sessions once a second.
func sampleConnections(ctx context.Context, adminURL, db string) []int {
	c, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return nil
	}
	defer c.Close(context.Background())
	var out []int
	for {
		var n int
		if err := c.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE datname = $1", db).Scan(&n); err == nil {
			out = append(out, n)
		}
		select {
		case <-ctx.Done():
			return out
		case <-time.After(time.Second):
		}
	}
}

// probe sends ten timed notifications a second on the change channel;
// every process's probe listener times their arrival.
func probe(ctx context.Context, dbURL string) {
	c, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return
	}
	defer c.Close(context.Background())
	for ctx.Err() == nil {
		payload := "1 " + probePrefix + strconv.FormatInt(time.Now().UnixNano(), 10)
		_, _ = c.Exec(ctx, "SELECT pg_notify($1, $2)", repository.ChangeChannel, payload)
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func dbName(u string) string {
	cfg, err := pgx.ParseConfig(u)
	if err != nil {
		return ""
	}
	return cfg.Database
}

func maxMean(xs []int) (float64, float64) {
	if len(xs) == 0 {
		return 0, 0
	}
	sum := 0
	for _, x := range xs {
		sum += x
	}
	return float64(slices.Max(xs)), float64(sum) / float64(len(xs))
}

// spread is "min–max" of xs.
func spread(xs []float64) string {
	if len(xs) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f–%.0f", slices.Min(xs), slices.Max(xs))
}

// child is one app process of the fleet.
type child struct {
	cmd    *exec.Cmd
	lines  chan report
	stderr *tail
}

func startChild(self string, env []string, mode string) (*child, error) {
	cmd := exec.Command(self, mode)
	cmd.Env = append(env, envStarted+"="+strconv.FormatInt(time.Now().UnixNano(), 10))
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, lines: make(chan report, 8), stderr: &tail{}}
	cmd.Stderr = c.stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var r report
			if json.Unmarshal(sc.Bytes(), &r) == nil {
				c.lines <- r
			}
		}
	}()
	return c, nil
}

func (c *child) await(event string, within time.Duration) (report, error) {
	select {
	case r, ok := <-c.lines:
		if !ok {
			return report{}, fmt.Errorf("process %d ended before %q: %s", c.cmd.Process.Pid, event, c.stderr.String())
		}
		if r.Event != event {
			return r, fmt.Errorf("process %d: %q, want %q", c.cmd.Process.Pid, r.Event, event)
		}
		return r, nil
	case <-time.After(within):
		return report{}, fmt.Errorf("process %d: no %q within %v: %s", c.cmd.Process.Pid, event, within, c.stderr.String())
	}
}

func (c *child) kill() {
	if c.cmd.ProcessState == nil {
		_ = c.cmd.Process.Kill()
		_ = c.cmd.Wait()
	}
}

// tail keeps the last few KB a process wrote on stderr.
type tail struct {
	mu sync.Mutex
	b  []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > 4096 {
		t.b = t.b[len(t.b)-4096:]
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.b))
}

// Table writes the results side by side, one column per run.
func Table(out io.Writer, res []Result) {
	if len(res) == 0 {
		return
	}
	row := func(name string, f func(Result) string) {
		fmt.Fprintf(out, "| %s |", name)
		for _, r := range res {
			fmt.Fprintf(out, " %s |", f(r))
		}
		fmt.Fprintln(out)
	}
	row("rows / TOKEN_CACHE_SIZE", func(r Result) string { return fmt.Sprintf("%d / %d", r.Rows, r.Cache) })
	fmt.Fprint(out, "|---|")
	for range res {
		fmt.Fprint(out, "---|")
	}
	fmt.Fprintln(out)
	row("seed (COPY), s", func(r Result) string { return fmt.Sprintf("%.1f", r.SeedS) })
	row("start-up, ms (min–max)", func(r Result) string { return spread(r.StartupMS) })
	row("RSS after touching the working set, MiB", func(r Result) string { return spread(r.TouchedRSSMB) })
	row("Go heap in use after GC, MiB", func(r Result) string { return spread(r.HeapMB) })
	row("RSS peak (VmHWM), MiB", func(r Result) string { return spread(r.HWMMB) })
	row("touching the working set, s", func(r Result) string { return spread(r.TouchS) })
	row("Token calls / errors", func(r Result) string { return fmt.Sprintf("%d / %d", r.Calls, r.Errors) })
	row("refreshes (per s) / reuse", func(r Result) string {
		return fmt.Sprintf("%d (%.1f/s) / %d", r.Refreshes, r.RefreshPerS, r.Reuse)
	})
	row("Postgres sessions, max (mean)", func(r Result) string { return fmt.Sprintf("%.0f (%.0f)", r.PGConnsMax, r.PGConnsMean) })
	row("NOTIFY lag p50 / p99, ms (worst process)", func(r Result) string { return fmt.Sprintf("%.1f / %.1f", r.LagP50MS, r.LagP99MS) })
	row("tokenctl status: lines, s, peak RSS MiB", func(r Result) string {
		return fmt.Sprintf("%d, %.1f, %.0f", r.StatusLines, r.StatusS, r.StatusHWMMB)
	})
	row("sweep: refreshed of due, conn/s (ceiling)", func(r Result) string {
		return fmt.Sprintf("%d of %d, %.0f/s (%.0f/s)", r.SweepRefreshed, r.SweepDue, r.SweepPerS, r.SweepCeiling)
	})
}
