package usecase

import (
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
	epoch uint64
	// floor is the newest version other processes announced: a token
	// below it is superseded and must not be cached again.
	floor int64
}

// get returns a cached token that is fresh at now.
func (c *tokenCache) get(id string, now time.Time, skew time.Duration) (domain.Token, bool) {
	if !c.trusted.Load() {
		return domain.Token{}, false
	}
	v, ok := c.slots.Load(id)
	if !ok {
		return domain.Token{}, false
	}
	s := v.(*cacheSlot).cur.Load()
	if s == nil || s.epoch != c.epoch.Load() || s.tok.Version < s.floor || !s.tok.FreshAt(now, skew) {
		return domain.Token{}, false
	}
	return s.tok, true
}

// begin returns the epoch a read starts in; put refuses the result if the
// epoch moved on meanwhile.
func (c *tokenCache) begin() uint64 { return c.epoch.Load() }

// put remembers tok if nothing newer is known.
func (c *tokenCache) put(tok domain.Token, epoch uint64) {
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
		if slot.cur.CompareAndSwap(old, &snapshot{tok: tok, epoch: epoch, floor: floor}) {
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
				next.tok, next.epoch = old.tok, old.epoch
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
