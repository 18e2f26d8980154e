package scalebench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tokenguard/tokenguard/di"
	"github.com/tokenguard/tokenguard/infra/tokenctl"
	"github.com/tokenguard/tokenguard/repository"
)

// Child environment, besides the app's own (DATABASE_URL, OAUTH_*,
// TOKEN_CACHE_SIZE, ...).
const (
	envRows    = "SCALEBENCH_ROWS"    // rows in the table
	envWave    = "SCALEBENCH_WAVE"    // connections 0..WAVE-1 are the refreshed ones
	envWS      = "SCALEBENCH_WS"      // distinct connections this process touches besides the wave
	envSeed    = "SCALEBENCH_SEED"    // its random sample
	envWorkers = "SCALEBENCH_WORKERS" // goroutines calling Token
	envStarted = "SCALEBENCH_STARTED" // Unix nanoseconds the driver started the process
	envRate    = "SCALEBENCH_RATE"    // Token calls per second of the process while serving
)

// report is one JSON line a child writes on stdout.
type report struct {
	Event     string  `json:"event"` // ready, touched, done
	StartupMS float64 `json:"startup_ms,omitempty"`
	RSSKB     int64   `json:"rss_kb,omitempty"`
	HWMKB     int64   `json:"hwm_kb,omitempty"`
	HeapMB    float64 `json:"heap_mb,omitempty"`
	TouchS    float64 `json:"touch_s,omitempty"`
	Calls     int64   `json:"calls,omitempty"`
	Errors    int64   `json:"errors,omitempty"`
	FirstErr  string  `json:"first_error,omitempty"`
	Lags      int     `json:"lags,omitempty"`
	LagP50MS  float64 `json:"lag_p50_ms,omitempty"`
	LagP99MS  float64 `json:"lag_p99_ms,omitempty"`
}

// Name is connection i's name.
func Name(i int) string { return fmt.Sprintf("c-%07d", i) }

// Child is one app process of the fleet: it starts tokenguard as the apps
// do (di.NewTokens: migrations off, key check, listener), touches its
// working set once, then calls Token at random over it until SIGTERM, half
// the calls on the refreshed (wave) connections.
func Child(environ []string, out io.Writer) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	get := func(k string) int { n, _ := strconv.Atoi(os.Getenv(k)); return n }
	rows, wave, wsN, seed, workers := get(envRows), get(envWave), get(envWS), get(envSeed), max(get(envWorkers), 1)
	every := time.Duration(float64(time.Second) * float64(workers) / float64(max(get(envRate), 1))) // per worker
	started, _ := strconv.ParseInt(os.Getenv(envStarted), 10, 64)
	enc := json.NewEncoder(out)

	cfg, err := di.ConfigFromEnv(environ)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	tokens, closeTokens, err := di.NewTokens(ctx, cfg, log, di.TokenOptions{})
	if err != nil {
		return err
	}
	defer closeTokens()
	// A second listener in the process times the driver's probes: how
	// long a NOTIFY takes to arrive while the fleet works.
	lags := &lagProbe{}
	listenCtx, stopListening := context.WithCancel(context.Background())
	defer stopListening()
	go func() { _ = repository.NewChangeListener(cfg.ListenURL(), lags, nil).Run(listenCtx) }()
	_ = enc.Encode(report{Event: "ready", StartupMS: float64(time.Now().UnixNano()-started) / 1e6})

	// The working set: wsN distinct connections outside the wave.
	r := rand.New(rand.NewPCG(uint64(seed), 1))
	ws := make([]string, 0, wsN)
	seen := make(map[int]bool, wsN)
	for len(ws) < min(wsN, rows-wave) {
		i := wave + r.IntN(rows-wave)
		if !seen[i] {
			seen[i] = true
			ws = append(ws, Name(i))
		}
	}
	seen = nil
	var calls, errs atomic.Int64
	var firstErr atomic.Value
	call := func(name string) {
		calls.Add(1)
		if _, err := tokens.RefreshToken.Token(ctx, name); err != nil && ctx.Err() == nil {
			errs.Add(1)
			firstErr.CompareAndSwap(nil, err.Error())
		}
	}
	begin := time.Now()
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for range workers {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(len(ws)) && ctx.Err() == nil; i = next.Add(1) - 1 {
				call(ws[i])
			}
		})
	}
	wg.Wait()
	touch := time.Since(begin)
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rss, _ := procStatus("VmRSS")
	_ = enc.Encode(report{Event: "touched", RSSKB: rss, HeapMB: float64(ms.HeapInuse) / (1 << 20), TouchS: touch.Seconds(), Calls: calls.Load(), Errors: errs.Load()})

	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(seed), uint64(w)+2))
			tick := time.NewTicker(every)
			defer tick.Stop()
			for ctx.Err() == nil {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				if wave > 0 && r.IntN(2) == 0 {
					call(Name(r.IntN(wave)))
				} else {
					call(ws[r.IntN(len(ws))])
				}
			}
		})
	}
	wg.Wait()
	// closeTokens (deferred) waits for a refresh still in flight to store
	// its rotated token before the pool closes.
	rss, _ = procStatus("VmRSS")
	hwm, _ := procStatus("VmHWM")
	p50, p99, n := lags.quantiles()
	fe, _ := firstErr.Load().(string)
	return enc.Encode(report{Event: "done", RSSKB: rss, HWMKB: hwm, Calls: calls.Load(), Errors: errs.Load(), FirstErr: fe,
		Lags: n, LagP50MS: p50, LagP99MS: p99})
}

// probePrefix names the driver's probe notifications: "1 probe-<unix ns>".
const probePrefix = "probe-"

type lagProbe struct {
	mu   sync.Mutex
	lags []time.Duration
}

func (p *lagProbe) Invalidate(id string, _ int64) {
	sent, ok := strings.CutPrefix(id, probePrefix)
	if !ok {
		return
	}
	ns, err := strconv.ParseInt(sent, 10, 64)
	if err != nil {
		return
	}
	lag := time.Since(time.Unix(0, ns))
	p.mu.Lock()
	p.lags = append(p.lags, lag)
	p.mu.Unlock()
}

func (p *lagProbe) TrustCache(bool) {}

func (p *lagProbe) quantiles() (p50, p99 float64, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.lags) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(p.lags)
	slices.Sort(s)
	q := func(f float64) float64 { return float64(s[min(len(s)-1, int(f*float64(len(s))))]) / 1e6 }
	return q(0.50), q(0.99), len(s)
}

// procStatus reads a kB figure of /proc/self/status (VmRSS, VmHWM).
func procStatus(field string) (int64, error) {
	return procStatusOf("self", field)
}

func procStatusOf(pid, field string) (int64, error) {
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strconv.ParseInt(strings.Fields(v)[0], 10, 64)
		}
	}
	return 0, errors.New(field + " not found")
}

// Status is "tokenctl status" as the operator runs it, its output counted
// and dropped; it reports the lines, the time and the process's peak RSS.
func Status(environ []string, out io.Writer) error {
	start := time.Now()
	lines := &lineCounter{}
	var stderr strings.Builder
	if code := tokenctl.Main([]string{"status"}, di.Tokenctl(environ, io.Discard), tokenctl.IO{Stdout: lines, Stderr: &stderr}); code != 0 {
		return fmt.Errorf("tokenctl status: exit %d: %s", code, stderr.String())
	}
	hwm, _ := procStatus("VmHWM")
	return json.NewEncoder(out).Encode(report{Event: "status", Calls: lines.n, TouchS: time.Since(start).Seconds(), HWMKB: hwm})
}

type lineCounter struct{ n int64 }

func (c *lineCounter) Write(p []byte) (int, error) {
	for _, b := range p {
		if b == '\n' {
			c.n++
		}
	}
	return len(p), nil
}
