package usecase

import (
	"cmp"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// skewOf is the refresh skew of t's provider: its own, else Options.Skew.
func (u *RefreshTokenUseCase) skewOf(t domain.Token) time.Duration {
	if t.Provider != "" && u.opts.ProviderSkew != nil {
		if d := u.opts.ProviderSkew(t.Provider); d > 0 {
			return d
		}
	}
	return u.opts.Skew
}

// providerState is what this process knows of one provider: its connections share its client and
// token budget, so one provider's pause never holds back another's refreshes.
type providerState struct {
	gate clientGate // pauses its calls after it rejected the client
	hung clientGate // pauses its calls after one went unanswered past RefreshTimeout

	mu          sync.Mutex
	budgetUntil time.Time // its fleet-wide token budget was found spent until then
	queued      *byExpiry // the refreshes its spent budget holds back, while drainQueue runs
}

func (u *RefreshTokenUseCase) provider(name string) *providerState {
	if p, ok := u.providers.Load(name); ok {
		return p.(*providerState)
	}
	p, _ := u.providers.LoadOrStore(name, &providerState{
		gate: clientGate{why: "after it rejected the client", pause: domain.Pause{Policy: domain.ClientRejectedPause}},
		hung: clientGate{why: "while a refresh it was sent goes unanswered", pause: domain.Pause{Policy: domain.UnansweredPause}},
	})
	return p.(*providerState)
}

// ProviderChanged says provider's settings changed (a rotated client secret, say): its client gate
// opens, so the next refresh tries them at once.
func (u *RefreshTokenUseCase) ProviderChanged(provider string) {
	g := &u.provider(provider).gate
	g.pause.Succeed()
	g.generation.Add(1)
}

// clientGate holds back calls to a provider for a while after it rejected the client (or the token
// URL proved wrong) or left a refresh unanswered: all connections share the client, so one such
// answer stands for all. A success ends it.
type clientGate struct {
	why        string // what a closed gate says, after its pause
	pause      domain.Pause
	generation atomic.Uint64 // of the provider's settings (ProviderChanged)
}

// check returns the rejection that closes the gate at now, or nil.
func (g *clientGate) check(now time.Time) error {
	left, cause := g.pause.Check(now)
	if cause == nil {
		return nil
	}
	return fmt.Errorf("%w (provider not called for %v %s)", cause, left.Round(time.Millisecond), g.why)
}

// reject closes the gate after the provider answered err to a call made with settings; an answer
// to settings replaced since (a rotated client secret) does not: the new ones deserve their try.
func (g *clientGate) reject(now time.Time, settings uint64, err error) {
	if settings == g.generation.Load() {
		g.pause.Fail(now, err)
	}
}

// spent records that p's budget allows no request before until.
func (p *providerState) spent(until time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if until.After(p.budgetUntil) {
		p.budgetUntil = until
	}
}

// budgetWait is how long p's budget is still known to be spent at now.
func (p *providerState) budgetWait(now time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return max(p.budgetUntil.Sub(now), 0)
}

// throttle lets a key's event happen only when its last one is at least some interval old. It
// forgets keys older than keep (the longest interval asked for) and holds at most limit keys
// (throttleLimit when 0): past that, a new key is refused, erring on the throttle's side.
type throttle struct {
	keep  time.Duration
	limit int
	mu    sync.Mutex
	last  map[string]time.Time
	sweep int // size at which old keys are next swept out
}

const (
	forgetAt      = 256   // the size beyond which old keys are swept out as new ones come
	throttleLimit = 65536 // bounds a throttle's keys by default
)

// allow reports whether key's last event is at least every (<= keep) ago, then records now.
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
		maps.DeleteFunc(th.last, func(_ string, last time.Time) bool { return now.Sub(last) >= th.keep })
		// Sweep again only once the map has doubled: constant cost per event.
		th.sweep = 2 * len(th.last)
		if len(th.last) >= limit {
			return false
		}
	}
	th.last[key] = now
	return true
}
