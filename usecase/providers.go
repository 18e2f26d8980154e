package usecase

import (
	"sync"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// skewOf is the refresh skew of t's provider: its own, else Options.Skew.
// The cache stores the instant it yields with each token, so the hit path
// never asks.
func (u *RefreshTokenUseCase) skewOf(t domain.Token) time.Duration {
	if t.Provider == "" || u.opts.ProviderSkew == nil {
		return u.opts.Skew
	}
	if d := u.opts.ProviderSkew(t.Provider); d > 0 {
		return d
	}
	return u.opts.Skew
}

// clientGates holds one clientGate per provider: a provider that rejects
// the client (its secret is being rotated, say) pauses the calls to that
// provider only, never another provider's refreshes. The set is bounded
// by the providers a process's connections name.
type clientGates struct {
	why    string             // what a closed gate says (after the provider did what)
	policy domain.PausePolicy // how it pauses
	mu     sync.Mutex
	gates  map[string]*clientGate
}

func (g *clientGates) of(provider string) *clientGate {
	g.mu.Lock()
	defer g.mu.Unlock()
	c, ok := g.gates[provider]
	if !ok {
		if g.gates == nil {
			g.gates = map[string]*clientGate{}
		}
		c = &clientGate{why: g.why, pause: domain.Pause{Policy: g.policy}}
		g.gates[provider] = c
	}
	return c
}

// ProviderChanged says provider's settings changed (a rotated client
// secret, say): its client gate opens, so that the next refresh tries the
// new settings at once instead of waiting out a pause the old ones caused.
func (u *RefreshTokenUseCase) ProviderChanged(provider string) {
	u.gate.of(provider).reopen()
}
