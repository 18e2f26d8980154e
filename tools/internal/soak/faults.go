package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokenguard/tokenguard/internal/sandbox"
)

// The faults, by name.
const (
	fProviderSlow   = "provider-slow"
	fProvider5xx    = "provider-5xx"
	fProvider429    = "provider-429"
	fProviderHang   = "provider-hang"
	fProviderFreeze = "provider-freeze"
	fTerminate      = "pg-terminate-backend"
	fKill           = "kill-9"
	fPGRestart      = "pg-restart"
	fListenerPause  = "listener-pause"
	providerPrefix  = "provider-"
	killRestartWait = 10 * time.Second
)

// weights say how often each fault is drawn, after one of each.
var weights = []struct {
	name string
	n    int
}{
	{fProviderSlow, 2}, {fProvider5xx, 2}, {fProvider429, 1}, {fProviderHang, 1}, {fProviderFreeze, 1},
	{fTerminate, 2}, {fKill, 2}, {fPGRestart, 2}, {fListenerPause, 1},
}

// Fault is one fault injected.
type Fault struct {
	At     string        `json:"at"` // offset from the start
	Kind   string        `json:"kind"`
	Detail string        `json:"detail"`
	For    string        `json:"for,omitempty"` // how long it lasted
	start  time.Time     // window in which failures are its doing
	end    time.Time     //
	down   time.Duration // pg-restart: how long Postgres did not answer
	ready  time.Time     // pg-restart: when it answered again
	// kill-9: the app had a token request end within the refresh timeout,
	// so it may have died holding a lease between the attempts of a
	// retried refresh: its connection waits out the answer deadline.
	leaseMayLinger bool
}

type faultLog struct {
	mu  sync.Mutex
	all []*Fault
}

func (l *faultLog) add(f *Fault) {
	l.mu.Lock()
	l.all = append(l.all, f)
	l.mu.Unlock()
}

func (l *faultLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.all)
}

func (l *faultLog) list() []*Fault {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*Fault(nil), l.all...)
}

// faultRoom is the time left before the load stops in which no fault
// starts: enough for Postgres to come back and every kind of call to
// succeed again, so that each fault's recovery is measured.
const faultRoom = 10 * time.Second

// lostAnswerRecovery is how long a refresh hung at the provider keeps its
// connection from refreshing after the hang ended: the answer deadline,
// then the first pause of a lost answer (5 s) and the probe.
const lostAnswerRecovery = answerDeadline + 6*time.Second

// inject draws faults until ctx ends (none in its last faultRoom): a
// Postgres restart, each other kind once in random order, then by weight,
// FaultGap apart on average. Provider faults last a while and run
// alongside the others; the rest are done one at a time.
func (s *soak) inject(ctx context.Context) {
	var deck []string
	for _, w := range weights {
		deck = append(deck, w.name)
	}
	s.rng.Shuffle(len(deck), func(i, j int) { deck[i], deck[j] = deck[j], deck[i] })
	// A Postgres restart first: even a short run has one.
	deck = append([]string{fPGRestart}, slices.DeleteFunc(deck, func(k string) bool { return k == fPGRestart })...)
	var providerBusy sync.Mutex
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		gap := time.Duration(float64(s.o.FaultGap) * (0.5 + s.rng.Float64()))
		sleep(ctx, gap)
		if ctx.Err() != nil {
			return
		}
		if end, ok := ctx.Deadline(); ok && time.Until(end) < faultRoom {
			return // a fault now would end with the load, its recovery unmeasured
		}
		kind := s.draw(&deck)
		if strings.HasPrefix(kind, providerPrefix) {
			if !providerBusy.TryLock() {
				deck = append(deck, kind) // one provider fault at a time: later
				continue
			}
			d := time.Duration(2+s.rng.IntN(9)) * time.Second
			latency := maxLatency * time.Duration(1+s.rng.IntN(4)) / 4 // 650ms..2.6s
			if kind == fProviderFreeze {
				// Past the refresh timeout, within the answer deadline.
				d = refreshTimeout + time.Duration(1+s.rng.IntN(int((answerDeadline-refreshTimeout)/time.Second)-1))*time.Second
			}
			if s.o.Control {
				latency = answerDeadline + time.Second // answers after the client gave up
			}
			if end, ok := ctx.Deadline(); ok && kind == fProviderHang {
				// A hang's window lasts its lost answers' recovery too: it
				// must end before the load does, or the recovery is
				// counted as failures outside any window.
				if d = min(d, time.Until(end)-lostAnswerRecovery); d < 2*time.Second {
					providerBusy.Unlock()
					deck = append(deck, kind)
					continue
				}
			}
			rate := 0.3 + 0.7*s.rng.Float64()
			rng := rand.New(rand.NewPCG(s.rng.Uint64(), s.rng.Uint64())) // its own: drawn from on the provider's goroutines
			wg.Go(func() {
				defer providerBusy.Unlock()
				s.providerFault(ctx, kind, d, latency, rate, rng)
			})
			continue
		}
		s.hostFault(ctx, kind)
	}
}

func (s *soak) draw(deck *[]string) string {
	if len(*deck) > 0 {
		k := (*deck)[0]
		*deck = (*deck)[1:]
		return k
	}
	total := 0
	for _, w := range weights {
		total += w.n
	}
	n := s.rng.IntN(total)
	for _, w := range weights {
		if n < w.n {
			return w.name
		}
		n -= w.n
	}
	return weights[0].name
}

func (s *soak) providerFault(ctx context.Context, kind string, d, latency time.Duration, rate float64, rng *rand.Rand) {
	f := &Fault{Kind: kind, start: time.Now()}
	f.At = fmtOffset(s.since(f.start))
	var fault sandbox.Fault
	switch kind {
	case fProviderSlow:
		f.Detail = fmt.Sprintf("every refresh takes %s more", latency)
		s.sb.SetRefreshLatency(latency)
	case fProvider5xx:
		fault = sandbox.FaultUnavailable
		f.Detail = fmt.Sprintf("%.0f%% of refreshes answered 503", rate*100)
	case fProvider429:
		fault = sandbox.FaultTooManyRequests
		f.Detail = fmt.Sprintf("%.0f%% of refreshes answered 429 (Retry-After: 1)", rate*100)
	case fProviderHang:
		fault = sandbox.FaultHang
		f.Detail = fmt.Sprintf("%.0f%% of refreshes hang until the client gives up (the answer deadline) and are dropped", rate*100)
	case fProviderFreeze:
		// As a stopped process: requests queue, nothing is answered; on thaw
		// every queued request is processed and answered.
		thaw := make(chan struct{})
		defer close(thaw)
		f.Detail = "the token endpoint answers nothing, then its whole queue"
		s.sb.SetRefreshFault(func() sandbox.Fault { <-thaw; return sandbox.FaultNone })
	}
	if fault != sandbox.FaultNone {
		var mu sync.Mutex
		s.sb.SetRefreshFault(func() sandbox.Fault {
			mu.Lock()
			defer mu.Unlock()
			if rng.Float64() < rate {
				return fault
			}
			return sandbox.FaultNone
		})
	}
	s.faults.add(f)
	s.say("%7s  %-21s %s for %s", f.At, kind, f.Detail, d)
	sleep(ctx, d)
	s.clearProviderFaults()
	if kind == fProviderHang {
		// A request hung in the window is the fault's doing until it is
		// dropped (the answer deadline) and its lost answer's pause is
		// over: the refresh token is presented again after a probe.
		sleep(ctx, lostAnswerRecovery)
	}
	f.end = time.Now()
	f.For = f.end.Sub(f.start).Round(100 * time.Millisecond).String()
}

func (s *soak) clearProviderFaults() {
	s.sb.SetRefreshFault(nil)
	s.sb.SetRefreshLatency(0)
}

func (s *soak) hostFault(ctx context.Context, kind string) {
	f := &Fault{Kind: kind, start: time.Now()}
	f.At = fmtOffset(s.since(f.start))
	var err error
	switch kind {
	case fTerminate:
		err = s.terminateBackends(ctx, f)
	case fKill:
		err = s.killApp(ctx, f)
	case fPGRestart:
		err = s.restartPostgres(ctx, f)
	case fListenerPause:
		err = s.pauseListener(ctx, f)
	}
	f.end = time.Now()
	if err != nil {
		f.Detail += " (" + err.Error() + ")"
	}
	if f.For == "" {
		f.For = f.end.Sub(f.start).Round(100 * time.Millisecond).String()
	}
	if f.Detail == "" {
		return // nothing to do (say, no app in a state to be killed)
	}
	s.faults.add(f)
	s.say("%7s  %-21s %s", f.At, kind, f.Detail)
}

// terminateBackends ends one to three of the apps' sessions.
func (s *soak) terminateBackends(ctx context.Context, f *Fault) error {
	n := 1 + s.rng.IntN(3)
	return s.query(ctx, func(ctx context.Context, c *pgx.Conn) error {
		rows, err := c.Query(ctx, `
SELECT pid, application_name, state, pg_terminate_backend(pid)
FROM (SELECT pid, application_name, state FROM pg_stat_activity
      WHERE datname = current_database() AND pid <> pg_backend_pid()
        AND application_name <> 'tokenguard-soak' AND backend_type = 'client backend'
      -- Sessions holding a connection's lock first: their refresh is in
      -- its rotation window.
      ORDER BY pid IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory') DESC, random()
      LIMIT $1) b`, n)
		if err != nil {
			return err
		}
		defer rows.Close()
		var ended []string
		for rows.Next() {
			var pid int
			var name, state string
			var ok bool
			if err := rows.Scan(&pid, &name, &state, &ok); err != nil {
				return err
			}
			if name == "" {
				name = "pool"
			}
			if !ok {
				state += ", already gone"
			}
			ended = append(ended, fmt.Sprintf("%d (%s, %s)", pid, name, state))
		}
		f.Detail = "ended sessions " + strings.Join(ended, ", ")
		return rows.Err()
	})
}

// killApp kills a random app with SIGKILL, outside its rotation window,
// and starts it again after a moment.
func (s *soak) killApp(ctx context.Context, f *Fault) error {
	name := appNames[s.rng.IntN(len(appNames))]
	a := s.apps[name]
	a.mu.Lock()
	p := a.proc
	a.mu.Unlock()
	var pid int
	if !s.gate.killOutsideWindow(ctx, name, killRestartWait, func() {
		pid = p.Pid()
		f.start = time.Now()
		f.leaseMayLinger = f.start.Sub(s.gate.lastDone[name]) < refreshTimeout // the gate's lock is held
		p.Kill()
	}) {
		f.Detail = fmt.Sprintf("%s not killed: it stayed in its rotation window for %s", name, killRestartWait)
		return nil
	}
	f.At = fmtOffset(s.since(f.start))
	pause := time.Duration(500+s.rng.IntN(2500)) * time.Millisecond
	sleep(ctx, pause)
	err := s.startApp(context.WithoutCancel(ctx), name)
	f.Detail = fmt.Sprintf("%s pid %d killed, started again after %s (up after %s)", name, pid, pause,
		time.Since(f.start).Round(100*time.Millisecond))
	return err
}

// restartPostgres restarts the cluster (fast shutdown: every session
// ends) and waits until it answers again.
func (s *soak) restartPostgres(ctx context.Context, f *Fault) error {
	down, err := s.pg.Restart(context.WithoutCancel(ctx))
	f.down, f.ready = down, time.Now()
	f.Detail = fmt.Sprintf("restarted, answering again after %s", down.Round(time.Millisecond))
	return err
}

// pauseListener stops one app's LISTEN session (its Postgres backend gets
// SIGSTOP: the TCP connection stays open but nothing comes back, like a
// half-open connection) for a few seconds, then lets it go on (SIGCONT).
func (s *soak) pauseListener(ctx context.Context, f *Fault) error {
	var pids []int
	err := s.query(ctx, func(ctx context.Context, c *pgx.Conn) error {
		rows, err := c.Query(ctx, `SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND application_name = 'tokenguard-listener'`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var pid int
			if err := rows.Scan(&pid); err != nil {
				return err
			}
			pids = append(pids, pid)
		}
		return rows.Err()
	})
	if err != nil || len(pids) == 0 {
		if err == nil {
			f.Detail = "no listener session to pause"
		}
		return err
	}
	pid := pids[s.rng.IntN(len(pids))]
	d := time.Duration(3+s.rng.IntN(10)) * time.Second
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return err
	}
	sleep(context.WithoutCancel(ctx), d)
	err = syscall.Kill(pid, syscall.SIGCONT)
	f.Detail = fmt.Sprintf("listener backend pid %d (of %d) stopped (SIGSTOP) for %s", pid, len(pids), d)
	f.For = d.String()
	return err
}
