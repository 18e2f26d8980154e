package sandbox

import (
	"maps"
	"strings"
	"sync"
	"sync/atomic"
)

// Stats counts what the provider saw. It is also served as JSON at /stats.
type Stats struct {
	// CodeExchanges counts successful authorization_code grants.
	CodeExchanges int64 `json:"code_exchanges"`
	// Refreshes counts successful refresh_token grants (rotations).
	Refreshes int64 `json:"refreshes"`
	// RefreshReuse counts refresh_token grant requests presenting a refresh
	// token that had already been rotated away: the race tokenguard exists
	// to prevent.
	RefreshReuse int64 `json:"refresh_reuse"`
	// RefreshRejected counts refresh_token grant requests rejected for any
	// reason, including reuse, injected faults and revoked grants.
	RefreshRejected int64 `json:"refresh_rejected"`
	// RefreshFaults counts requests answered with an injected Fault
	// (FaultLostAnswer included: processed, not answered).
	RefreshFaults int64 `json:"refresh_faults"`
	// LostAnswers counts refreshes processed whose answer was never sent
	// (FaultLostAnswer); each is also in Refreshes.
	LostAnswers int64 `json:"lost_answers"`
	// GraceReplays counts rotated refresh tokens presented again within
	// Options.ReuseGrace, answered as the first time (not reuse).
	GraceReplays int64 `json:"grace_replays"`
	// RateLimited counts token requests answered 429 beyond
	// Options.TokenRate.
	RateLimited int64 `json:"rate_limited"`
	// Revocations counts revocation requests answered 200 (RFC 7009: an
	// unknown or already invalid token is answered 200 too).
	Revocations int64 `json:"revocations"`
	// ConsentPrompts counts authorization requests with prompt=consent:
	// those a real provider answers with its consent screen even for a
	// client the person approved before.
	ConsentPrompts int64 `json:"consent_prompts"`
	// ResourceOK and Resource401 count /resource calls accepted / rejected.
	ResourceOK  int64 `json:"resource_ok"`
	Resource401 int64 `json:"resource_401"`
	// DPoPBound counts grants bound to a DPoP key at their code exchange;
	// DPoPRefreshes the refreshes of bound grants (each also in
	// Refreshes); DPoPReuse the reuse of their rotated refresh tokens
	// (each also in RefreshReuse); DPoPRefused the requests for a bound
	// grant refused for their proof (missing, invalid, another key's), at
	// the token endpoint and at /resource.
	DPoPBound     int64 `json:"dpop_bound"`
	DPoPRefreshes int64 `json:"dpop_refreshes"`
	DPoPReuse     int64 `json:"dpop_reuse"`
	DPoPRefused   int64 `json:"dpop_refused"`
	// ResourceByAgent counts accepted /resource calls by User-Agent product
	// (the text before the first '/'; "unknown" when empty). It is a copy.
	ResourceByAgent map[string]int64 `json:"resource_by_agent"`
}

type counters struct {
	codeExchanges   atomic.Int64
	refreshes       atomic.Int64
	refreshReuse    atomic.Int64
	refreshRejected atomic.Int64
	refreshFaults   atomic.Int64
	lostAnswers     atomic.Int64
	graceReplays    atomic.Int64
	rateLimited     atomic.Int64
	revocations     atomic.Int64
	consentPrompts  atomic.Int64
	resourceOK      atomic.Int64
	resource401     atomic.Int64
	dpopBound       atomic.Int64
	dpopRefreshes   atomic.Int64
	dpopReuse       atomic.Int64
	dpopRefused     atomic.Int64

	agentsMu sync.Mutex
	agents   map[string]int64
}

func (c *counters) reset() {
	for _, n := range []*atomic.Int64{
		&c.codeExchanges, &c.refreshes, &c.refreshReuse, &c.refreshRejected,
		&c.refreshFaults, &c.lostAnswers, &c.graceReplays, &c.rateLimited, &c.revocations, &c.consentPrompts, &c.resourceOK, &c.resource401,
		&c.dpopBound, &c.dpopRefreshes, &c.dpopReuse, &c.dpopRefused,
	} {
		n.Store(0)
	}
	c.agentsMu.Lock()
	c.agents = make(map[string]int64)
	c.agentsMu.Unlock()
}

func (c *counters) resourceAccepted(userAgent string) {
	c.resourceOK.Add(1)
	c.agentsMu.Lock()
	c.agents[agentProduct(userAgent)]++
	c.agentsMu.Unlock()
}

// agentProduct returns the product name of a User-Agent header, e.g.
// "tokenguard-server" for "tokenguard-server/1.2 (linux)".
func agentProduct(userAgent string) string {
	product, _, _ := strings.Cut(userAgent, "/")
	if product = strings.TrimSpace(product); product == "" {
		return "unknown"
	}
	return product
}

// Stats returns a snapshot of the counters. Counters are read one by one, so
// a snapshot taken while requests are in flight may be slightly inconsistent
// across fields; each field is exact.
func (p *Provider) Stats() Stats {
	c := &p.stats
	s := Stats{
		CodeExchanges:   c.codeExchanges.Load(),
		Refreshes:       c.refreshes.Load(),
		RefreshReuse:    c.refreshReuse.Load(),
		RefreshRejected: c.refreshRejected.Load(),
		RefreshFaults:   c.refreshFaults.Load(),
		LostAnswers:     c.lostAnswers.Load(),
		GraceReplays:    c.graceReplays.Load(),
		RateLimited:     c.rateLimited.Load(),
		Revocations:     c.revocations.Load(),
		ConsentPrompts:  c.consentPrompts.Load(),
		ResourceOK:      c.resourceOK.Load(),
		Resource401:     c.resource401.Load(),
		DPoPBound:       c.dpopBound.Load(),
		DPoPRefreshes:   c.dpopRefreshes.Load(),
		DPoPReuse:       c.dpopReuse.Load(),
		DPoPRefused:     c.dpopRefused.Load(),
	}
	c.agentsMu.Lock()
	s.ResourceByAgent = maps.Clone(c.agents)
	c.agentsMu.Unlock()
	return s
}

// ResetStats zeroes all counters and empties the Timeline. It does not forget which refresh tokens
// were rotated away: presenting one later still counts as reuse.
func (p *Provider) ResetStats() {
	p.stats.reset()
	p.timeline.reset()
}
