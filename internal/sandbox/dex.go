package sandbox

import (
	"net/http"
	"time"
)

// DexDeadGrant is how Dex (dexidp/dex, server/refreshhandlers.go) answers
// a refresh token that is unknown, revoked, expired or already claimed:
// 400 invalid_request, the code RFC 6749 gives a malformed request. Only a
// token of another client gets invalid_grant.
var DexDeadGrant = DeadGrantAnswer{Status: http.StatusBadRequest, Code: "invalid_request",
	Description: "Refresh token is invalid or has already been claimed by another client."}

// DexReuseInterval is Dex's default reuseInterval: a rotated refresh token
// presented again within it is answered again, without a new rotation.
const DexReuseInterval = 3 * time.Second

// Dex switches opts to Dex's shape: its dead-grant answer and its reuse
// interval (unless opts sets a grace window of its own).
func Dex(opts Options) Options {
	d := DexDeadGrant
	opts.DeadGrant = &d
	if opts.ReuseGrace == 0 {
		opts.ReuseGrace = DexReuseInterval
	}
	return opts
}

// limited answers 429 with Retry-After: 1 when the token endpoint is over
// Options.TokenRate, and reports whether it did.
func (p *Provider) limited(w http.ResponseWriter) bool {
	if l := p.limiter.Load(); l == nil || l.Allow() {
		return false
	}
	p.stats.rateLimited.Add(1)
	w.Header().Set("Retry-After", "1")
	writeJSON(w, http.StatusTooManyRequests, map[string]any{"error": "slow_down"})
	return true
}
