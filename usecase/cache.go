package usecase

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// tokenCache keeps each connection's last known token as an immutable
// snapshot behind an atomic pointer, so the hot path is two loads and a
// time comparison: no lock, no allocation, no query.
//
// A cached token is served only while something vouches that this process
// hears about every change other processes commit (the change listener):
// without it the cache is bypassed. Each (re)connection of the listener
// starts a new epoch, and snapshots from an older epoch are ignored, so
// nothing cached before a gap in the change feed survives it.
type tokenCache struct {
	trusted atomic.Bool
	epoch   atomic.Uint64
	slots   sync.Map // connection id -> *cacheSlot
}

type cacheSlot struct {
	cur atomic.Pointer[snapshot]
}

type snapshot struct {
	tok   domain.Token // zero when only floor is known
	until int64        // Unix nanoseconds: fresh before this (expiry minus skew); 0 if unusable
	epoch uint64
	// floor is the newest version other processes announced: a token
	// below it is superseded and must not be cached again.
	floor int64
}

// lookup is what the cache knows about a connection.
type lookup int

const (
	miss  lookup = iota // nothing it can vouch for: read the store
	hit                 // a fresh token
	stale               // the current token, no longer fresh: go refresh
)

// get returns the snapshot of a cached token that is fresh at now (hit),
// or nil. Snapshots are immutable.
func (c *tokenCache) get(id string, now time.Time) (*snapshot, lookup) {
	if !c.trusted.Load() {
		return nil, miss
	}
	v, ok := c.slots.Load(id)
	if !ok {
		return nil, miss
	}
	s := v.(*cacheSlot).cur.Load()
	if s == nil || s.epoch != c.epoch.Load() || s.tok.Version == 0 || s.tok.Version < s.floor {
		return nil, miss
	}
	if now.UnixNano() >= s.until {
		return nil, stale
	}
	return s, hit
}

// begin returns the epoch a read starts in; put refuses the result if the
// epoch moved on meanwhile.
func (c *tokenCache) begin() uint64 { return c.epoch.Load() }

// put remembers tok, fresh until its expiry minus skew, if nothing newer is
// known.
func (c *tokenCache) put(tok domain.Token, epoch uint64, skew time.Duration) {
	if !c.trusted.Load() || tok.Status != domain.StatusActive {
		return
	}
	slot := c.slot(tok.ConnectionID)
	for {
		old := slot.cur.Load()
		var floor int64
		if old != nil {
			floor = old.floor
			if old.epoch == epoch && old.tok.Version > tok.Version {
				return // never go back to an older token
			}
		}
		if tok.Version < floor || epoch != c.epoch.Load() {
			return
		}
		next := &snapshot{tok: tok, until: freshUntil(tok, skew), epoch: epoch, floor: floor}
		if slot.cur.CompareAndSwap(old, next) {
			return
		}
	}
}

// invalidate records that the stored token of id is now at version: any
// older cached token is dropped.
func (c *tokenCache) invalidate(id string, version int64) {
	slot := c.slot(id)
	for {
		old := slot.cur.Load()
		next := &snapshot{epoch: c.epoch.Load(), floor: version}
		if old != nil {
			if old.floor >= version && old.tok.Version >= version {
				return
			}
			next.floor = max(old.floor, version)
			if old.tok.Version >= version {
				next.tok, next.until, next.epoch = old.tok, old.until, old.epoch
			}
		}
		if slot.cur.CompareAndSwap(old, next) {
			return
		}
	}
}

// setTrusted switches the cache on or off; either way a new epoch starts.
func (c *tokenCache) setTrusted(ok bool) {
	c.epoch.Add(1)
	c.trusted.Store(ok)
}

func (c *tokenCache) slot(id string) *cacheSlot {
	if v, ok := c.slots.Load(id); ok {
		return v.(*cacheSlot)
	}
	v, _ := c.slots.LoadOrStore(id, &cacheSlot{})
	return v.(*cacheSlot)
}

// freshUntil precomputes the freshness rule (domain.Token.FreshAt) as one
// instant, so that the hot path is a single integer comparison.
func freshUntil(tok domain.Token, skew time.Duration) int64 {
	if tok.Status != domain.StatusActive || tok.AccessToken.IsZero() {
		return 0
	}
	if tok.Expiry.IsZero() {
		return math.MaxInt64
	}
	return tok.Expiry.Add(-tok.EffectiveSkew(skew)).UnixNano()
}
