package usecase

import (
	"sync"
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

// clientGates holds one clientGate per provider, so one provider's pause
// never holds back another's refreshes.
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
// secret, say): its client gate opens, so the next refresh tries them at once.
func (u *RefreshTokenUseCase) ProviderChanged(provider string) {
	u.gate.of(provider).reopen()
}
