package domain

import (
	"math/rand/v2"
	"sync"
	"time"
)

// A PausePolicy is one backoff: after After failures in a row (1 when 0) calls pause for
// First, doubling up to Max, spread by ±Jitter so that processes do not call together again.
type PausePolicy struct {
	After  int
	First  time.Duration
	Max    time.Duration
	Jitter float64
}

// The pauses tokenguard keeps, one row each (docs/providers.md).
var (
	// ClientRejectedPause: the client or token URL was rejected; short, to notice a fix within seconds.
	ClientRejectedPause = PausePolicy{First: 250 * time.Millisecond, Max: 2 * time.Second, Jitter: 0.2}
	// UnansweredPause: a refresh went unanswered past the refresh timeout. Per process and provider.
	UnansweredPause = PausePolicy{First: 250 * time.Millisecond, Max: 2 * time.Second, Jitter: 0.2}
	// UnreachablePause: the token endpoint could not be reached three times in a row.
	UnreachablePause = PausePolicy{After: 3, First: 250 * time.Millisecond, Max: 4 * time.Second, Jitter: 0.2}
	// FailingPause: unclassified or lost answers to a connection's refreshes:
	// attempts at 0, 5, 15, 35 and 75 s, then one a minute, fleet-wide.
	FailingPause = PausePolicy{First: 5 * time.Second, Max: time.Minute}
)

// Wait is the pause after the n-th failure in a row, without jitter.
func (p PausePolicy) Wait(n int) time.Duration {
	n -= max(p.After, 1)
	if n < 0 {
		return 0
	}
	d := p.First
	for ; n > 0 && d < p.Max; n-- {
		d *= 2
	}
	return min(d, p.Max)
}

// Pause holds calls back after failures, as its Policy says; a success ends it.
// Failures during a pause neither lengthen it nor count towards the next.
type Pause struct {
	Policy PausePolicy

	mu       sync.Mutex
	failures int // in a row, outside pauses
	until    time.Time
	cause    error
}

// Check reports how long calls still pause at now (0: they may go), and the failure that paused them.
func (p *Pause) Check(now time.Time) (time.Duration, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !now.Before(p.until) {
		return 0, nil
	}
	return p.until.Sub(now), p.cause
}

// Fail records a failure at now, and reports whether it started a pause.
func (p *Pause) Fail(now time.Time, err error) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if now.Before(p.until) {
		return false
	}
	p.failures++
	d := p.Policy.Wait(p.failures)
	if d <= 0 {
		return false
	}
	if j := p.Policy.Jitter; j > 0 {
		d = min(time.Duration(float64(d)*(1-j+2*j*rand.Float64())), p.Policy.Max)
	}
	p.until, p.cause = now.Add(d), err
	return true
}

// Succeed ends the pause and the failures in a row.
func (p *Pause) Succeed() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failures, p.until, p.cause = 0, time.Time{}, nil
}
