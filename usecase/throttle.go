package usecase

import (
	"cmp"
	"fmt"
	"sync"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// throttle lets an event for a key happen only when the key's last one is
// at least some interval old. It forgets keys older than keep (the longest
// interval asked for) and holds at most limit keys (throttleLimit when 0):
// past that, a new key is refused, erring on the throttle's side.
type throttle struct {
	keep  time.Duration
	limit int
	mu    sync.Mutex
	last  map[string]time.Time
	sweep int // size at which old keys are next swept out
}

// forgetAt is the size beyond which old keys are swept out as new ones come.
const forgetAt = 256

// throttleLimit bounds a throttle's keys by default.
const throttleLimit = 65536

// allow reports whether key's last event is at least every ago (every <=
// keep), and if so records now as its last.
func (th *throttle) allow(key string, now time.Time, every time.Duration) bool {
	th.mu.Lock()
	defer th.mu.Unlock()
	last, ok := th.last[key]
	if ok && now.Sub(last) < every {
		return false
	}
	if th.last == nil {
		th.last = map[string]time.Time{}
	}
	limit := cmp.Or(th.limit, throttleLimit)
	if !ok && (len(th.last) >= max(th.sweep, forgetAt) || len(th.last) >= limit) {
		for k, last := range th.last {
			if now.Sub(last) >= th.keep {
				delete(th.last, k)
			}
		}
		// Sweep again only once the map has doubled: constant cost per event.
		th.sweep = 2 * len(th.last)
		if len(th.last) >= limit {
			return false
		}
	}
	th.last[key] = now
	return true
}

// clientGate holds back this process's calls to a provider for a while
// after it rejected the client (or the token URL proved wrong), or left a
// refresh unanswered: every connection shares the client, so one such
// answer stands for all. A success ends it.
type clientGate struct {
	why        string // what a closed gate says, after its pause
	pause      domain.Pause
	mu         sync.Mutex
	generation uint64 // the provider's settings seen (reopen)
}

// check returns the rejection that closes the gate at now, or nil.
func (g *clientGate) check(now time.Time) error {
	left, cause := g.pause.Check(now)
	if cause == nil {
		return nil
	}
	return fmt.Errorf("%w (provider not called for %v %s)", cause, left.Round(time.Millisecond), g.why)
}

// reject closes the gate after the provider answered err to a call made
// with generation settings; an answer to settings replaced since (a rotated
// client secret) does not: the new settings deserve their try.
func (g *clientGate) reject(now time.Time, settings uint64, err error) {
	if settings != g.settings() {
		return
	}
	g.pause.Fail(now, err)
}

// settings is the generation of the provider's settings.
func (g *clientGate) settings() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.generation
}

// reopen opens the gate because the provider's settings changed.
func (g *clientGate) reopen() {
	g.accept()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.generation++
}

// accept opens the gate after a success.
func (g *clientGate) accept() { g.pause.Succeed() }
