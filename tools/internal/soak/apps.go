package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/tokenguard/tokenguard/infra/batch"
	"github.com/tokenguard/tokenguard/tools/internal/demo"
)

// app is one of the long-running apps; a kill -9 replaces its process.
type app struct {
	name string
	log  *os.File // all its processes' output, appended

	mu     sync.Mutex
	proc   *demo.Proc
	starts int
}

func (a *app) running() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.proc == nil {
		return false
	}
	select {
	case <-a.proc.Done():
		return false
	default:
		return true
	}
}

// startApp starts (or starts again) an app; the server must answer
// /healthz before it returns.
func (s *soak) startApp(ctx context.Context, name string) error {
	a := s.apps[name]
	if a == nil {
		f, err := os.Create(filepath.Join(s.o.OutDir, name+".log"))
		if err != nil {
			return err
		}
		a = &app{name: name, log: f}
		s.apps[name] = a
	}
	var args []string
	stdout := &lines{fn: func(l string) { s.logLine(a, l) }}
	if name == "batch" {
		args = []string{"--every", "1s"}
		stdout = &lines{fn: func(l string) { s.roundLine(a, l) }}
	}
	p, err := demo.Start(demo.ProcSpec{Name: name, Path: filepath.Join(s.o.BinDir, name), Args: args, Env: s.env,
		Stdout: stdout, Stderr: &lines{fn: func(l string) { s.logLine(a, l) }}})
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.proc = p
	a.starts++
	a.mu.Unlock()
	s.gate.forget(name) // a new process has no rotated token in hand
	if name != "server" {
		return nil
	}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(s.server + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.Done():
			return fmt.Errorf("server exited with status %d; see %s/server.log", p.ExitCode(), s.o.OutDir)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("server not healthy after 60s; see %s/server.log", s.o.OutDir)
}

// stopApps sends SIGTERM to every app still running. Safe to call twice.
func (s *soak) stopApps() {
	var wg sync.WaitGroup
	for _, a := range s.apps {
		a.mu.Lock()
		p := a.proc
		a.mu.Unlock()
		if p != nil {
			wg.Go(func() { p.Stop(10 * time.Second) })
		}
	}
	wg.Wait()
	for _, a := range s.apps {
		_ = a.log.Sync()
	}
}

// The log lines of the rotation window (usecase/refresh.go).
const (
	msgNotPersisted = "rotated refresh token not persisted; retrying the write"
	msgRetried      = "rotated refresh token persisted on retry"
	msgDropped      = "rotated refresh token dropped"
)

// logLine keeps an app's line and follows its rotated tokens in hand.
func (s *soak) logLine(a *app, line string) {
	_, _ = a.log.WriteString(line + "\n")
	s.versions.line(line)
	if !strings.Contains(line, "rotated refresh token") {
		return
	}
	var rec struct {
		Msg        string `json:"msg"`
		Connection string `json:"connection"`
		Err        string `json:"err"`
	}
	if json.Unmarshal([]byte(line), &rec) != nil {
		return
	}
	now := time.Now()
	switch rec.Msg {
	case msgNotPersisted:
		s.gate.rescuing(a.name, +1)
		s.logs.add(&s.logs.notPersisted, a.name, rec.Connection, rec.Err, s.since(now))
	case msgRetried:
		s.gate.rescuing(a.name, -1)
		s.logs.add(&s.logs.retried, a.name, rec.Connection, "", s.since(now))
	case msgDropped:
		s.gate.rescuing(a.name, -1)
		s.logs.add(&s.logs.dropped, a.name, rec.Connection, rec.Err, s.since(now))
	}
}

// roundLine reads one of batch's rounds.
func (s *soak) roundLine(a *app, line string) {
	_, _ = a.log.WriteString(line + "\n")
	var r batch.Round
	if json.Unmarshal([]byte(line), &r) != nil {
		s.logLine(a, line)
		return
	}
	end := time.Now()
	failed := max(r.Failed, len(r.Errors))
	s.calls.add("batch", end.Add(-time.Duration(r.DurationMS)*time.Millisecond), end, failed == 0,
		fmt.Sprintf("round %d: %d of %d calls failed: %s", r.Round, failed, r.Calls, strings.Join(r.Errors, "; ")))
}

// LogEntry is one rotation-window line an app logged.
type LogEntry struct {
	At         string `json:"at"`
	App        string `json:"app"`
	Connection string `json:"connection"`
	Err        string `json:"err,omitempty"`
}

type logCounts struct {
	mu           sync.Mutex
	notPersisted []LogEntry
	retried      []LogEntry
	dropped      []LogEntry
}

func (l *logCounts) add(to *[]LogEntry, app, conn, err string, at time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	*to = append(*to, LogEntry{At: fmtOffset(at), App: app, Connection: conn, Err: err})
}

// gate follows each app's requests at the provider's token endpoint and
// its rotated tokens not yet stored (from its log), so that a kill -9
// lands only outside the rotation window: killed there, a process takes
// the only live refresh token with it, and a strict provider revokes the
// grant at the next refresh. docs/design.md ("The rotation window") states that
// limit; the soak measures everything else.
type gate struct {
	mu       sync.Mutex
	inFlight map[string]int
	lastDone map[string]time.Time
	rescues  map[string]int
	deferred int  // kills put off because the target was in the window
	open     bool // kill at once (Options.Control)
}

// settle covers the commit after the provider's answer.
const settle = time.Second

func (g *gate) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/oauth2/token" {
			h.ServeHTTP(w, r)
			return
		}
		app := strings.TrimPrefix(strings.SplitN(r.UserAgent(), "/", 2)[0], "tokenguard-")
		g.mu.Lock()
		g.inFlight[app]++
		g.mu.Unlock()
		defer func() {
			g.mu.Lock()
			g.inFlight[app]--
			g.lastDone[app] = time.Now()
			g.mu.Unlock()
		}()
		h.ServeHTTP(w, r)
	})
}

func (g *gate) rescuing(app string, d int) {
	g.mu.Lock()
	g.rescues[app] = max(g.rescues[app]+d, 0)
	g.mu.Unlock()
}

func (g *gate) forget(app string) {
	g.mu.Lock()
	g.rescues[app] = 0
	g.mu.Unlock()
}

// killOutsideWindow runs kill while app has no token request at the
// provider, none answered within settle, and no rotated token waiting to
// be stored; new token requests wait meanwhile. It tries for up to
// within and reports whether kill ran.
func (g *gate) killOutsideWindow(ctx context.Context, app string, within time.Duration, kill func()) bool {
	deadline := time.Now().Add(within)
	for waited := false; ; waited = true {
		g.mu.Lock()
		if g.open || g.inFlight[app] == 0 && g.rescues[app] == 0 && time.Since(g.lastDone[app]) > settle {
			kill()
			if waited {
				g.deferred++
			}
			g.mu.Unlock()
			return true
		}
		g.mu.Unlock()
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		sleep(ctx, 50*time.Millisecond)
	}
}
