package sandbox

import (
	"slices"

	"github.com/ory/fosite"
)

// clientSecrets replace the registered client's secret: current, and the
// earlier ones still accepted during a rotation (fosite's RotatedSecrets).
type clientSecrets struct {
	current string
	old     []string
}

// RotateClientSecret makes secret the client's secret, as an operator
// does at a real provider. With keepOld the secrets accepted so far stay
// accepted too (the overlap real providers offer, until
// DropOldClientSecrets); without, a request with one of them is answered
// 401 invalid_client from now on. Safe while requests are in flight.
func (p *Provider) RotateClientSecret(secret string, keepOld bool) {
	p.secretMu.Lock()
	defer p.secretMu.Unlock()
	next := &clientSecrets{current: secret}
	if keepOld {
		cur := p.store.secrets.Load()
		if cur == nil {
			next.old = []string{p.secret}
		} else {
			next.old = append(slices.Clone(cur.old), cur.current)
		}
	}
	p.store.secrets.Store(next)
}

// DropOldClientSecrets ends the overlap of RotateClientSecret: only the
// current secret is accepted.
func (p *Provider) DropOldClientSecrets() {
	p.secretMu.Lock()
	defer p.secretMu.Unlock()
	if cur := p.store.secrets.Load(); cur != nil {
		p.store.secrets.Store(&clientSecrets{current: cur.current})
	}
}

// ClientSecret is the client's current secret.
func (p *Provider) ClientSecret() string {
	if cur := p.store.secrets.Load(); cur != nil {
		return cur.current
	}
	return p.secret
}

// withSecrets is c with the rotated secrets, if any.
func (s *store) withSecrets(c fosite.Client) fosite.Client {
	sec := s.secrets.Load()
	if sec == nil {
		return c
	}
	apply := func(dc fosite.DefaultClient) *fosite.DefaultClient {
		dc.Secret = []byte(sec.current)
		dc.RotatedSecrets = nil
		for _, o := range sec.old {
			dc.RotatedSecrets = append(dc.RotatedSecrets, []byte(o))
		}
		return &dc
	}
	switch dc := c.(type) {
	case *fosite.DefaultClient:
		return apply(*dc)
	case *fosite.DefaultOpenIDConnectClient:
		cp := *dc
		cp.DefaultClient = apply(*dc.DefaultClient)
		return &cp
	}
	return c
}
