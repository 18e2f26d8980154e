package usecase

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// tokenCache keeps each connection's last known token as an immutable snapshot behind an atomic
// pointer: a hit takes no lock, allocation or query. It serves only while trusted (the change
// listener hears every commit); each (re)connection starts a new epoch, so nothing cached before a
// gap in the change feed survives it. CLOCK eviction, unlike LRU, neither locks nor allocates on a
// hit. A change announced for, or eviction of, a slot-less connection advances its shard's
// sequence, refusing any read of it begun before.
type tokenCache struct {
	trusted  atomic.Bool
	epoch    atomic.Uint64
	slots    sync.Map // connection id -> *cacheSlot
	size     atomic.Int64
	capacity int64
	clock    Clock // bounds the stay of tokens without expiry
	evicting atomic.Bool

	seq    atomic.Uint64
	shards [cacheShards]atomic.Uint64 // seq of the last slot-less change or eviction per shard

	onRegress func(id string, known, stored int64) // a read found id behind a committed version; may be nil
}

const (
	cacheShards = 256
	untimedTTL  = time.Minute // bounds how long a token without expiry is served from the cache
)

var shardSeed = maphash.MakeSeed()

func shardOf(id string) int { return int(maphash.String(shardSeed, id) % cacheShards) }

type cacheSlot struct {
	cur  atomic.Pointer[snapshot]
	ref  atomic.Bool // hit since the last sweep
	hist versionHistory
}

type snapshot struct {
	tok     domain.Token // zero when only floor is known; never holds the refresh token
	until   int64        // Unix nanoseconds: fresh before this (expiry minus skew); 0 if unusable
	epoch   uint64
	floor   int64 // the newest version announced: a token below it must not be cached again
	untimed bool  // the token has no expiry: until only bounds its stay
}

// cacheMark is when a read of the store began, as put needs to know it.
type cacheMark struct{ epoch, seq uint64 }

// lookup is what the cache knows about a connection.
type lookup int

const (
	miss  lookup = iota // nothing it can vouch for: read the store
	hit                 // a fresh token
	stale               // the current token, no longer fresh: go refresh
)

// get returns what the cache knows of id at now, nil on a miss; snapshots are immutable.
func (c *tokenCache) get(id string, now time.Time) (*snapshot, lookup) {
	if !c.trusted.Load() {
		return nil, miss
	}
	v, ok := c.slots.Load(id)
	if !ok {
		return nil, miss
	}
	slot := v.(*cacheSlot)
	s := slot.cur.Load()
	if s == nil || s.epoch != c.epoch.Load() || s.tok.Version == 0 || s.tok.Version < s.floor {
		return nil, miss
	}
	if now.UnixNano() >= s.until {
		if s.untimed {
			return nil, miss
		}
		return s, stale // what was cached: the version the refresh is for
	}
	if !slot.ref.Load() {
		slot.ref.Store(true)
	}
	return s, hit
}

// begin marks the start of a read of the store; put refuses its result if the epoch or shard moved on.
func (c *tokenCache) begin() cacheMark { return cacheMark{epoch: c.epoch.Load(), seq: c.seq.Load()} }

// put remembers tok, fresh until its expiry minus skew, if nothing newer is known. The refresh
// token stays out: the hot path never needs it.
func (c *tokenCache) put(tok domain.Token, m cacheMark, skew time.Duration) {
	c.read(tok.Connection, tok.Version, m, false)
	if !c.trusted.Load() || tok.Status != domain.StatusActive || c.shards[shardOf(tok.Connection)].Load() > m.seq {
		return
	}
	tok.RefreshToken = domain.Secret{}
	// domain.Token.FreshAt as one instant, for the hot path.
	var until int64
	untimed := tok.Expiry.IsZero()
	switch {
	case tok.AccessToken.IsZero():
	case untimed:
		until = c.clock.Now().Add(untimedTTL).UnixNano()
	default:
		until = tok.Expiry.Add(-tok.EffectiveSkew(skew)).UnixNano()
	}
	slot := c.slot(tok.Connection)
	for {
		old := slot.cur.Load()
		var floor int64
		if old != nil {
			floor = old.floor
			if old.epoch == m.epoch && old.tok.Version > tok.Version {
				return // never go back to an older token
			}
		}
		if tok.Version < floor || m.epoch != c.epoch.Load() {
			return
		}
		next := &snapshot{tok: tok, until: until, epoch: m.epoch, floor: floor, untimed: untimed}
		if slot.cur.CompareAndSwap(old, next) {
			return
		}
	}
}

// invalidate drops cached tokens of id older than version, recording nothing as committed (a
// forced refresh's version may not exist).
func (c *tokenCache) invalidate(id string, version int64) {
	v, ok := c.slots.Load(id)
	if !ok {
		c.shards[shardOf(id)].Store(c.seq.Add(1))
		return
	}
	slot := v.(*cacheSlot)
	for {
		old := slot.cur.Load()
		next := &snapshot{epoch: c.epoch.Load(), floor: version}
		if old != nil {
			if old.floor >= version && old.tok.Version >= version {
				return
			}
			next.floor = max(old.floor, version)
			if old.tok.Version >= version {
				next.tok, next.until, next.epoch, next.untimed = old.tok, old.until, old.epoch, old.untimed
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
	v, loaded := c.slots.LoadOrStore(id, &cacheSlot{})
	if !loaded && c.size.Add(1) > c.capacity && c.capacity > 0 {
		c.evict()
	}
	return v.(*cacheSlot)
}

// evict sweeps the slots down to 90% of capacity, sparing once each slot hit since the last sweep.
// One sweep runs at a time; others go on.
func (c *tokenCache) evict() {
	if !c.evicting.CompareAndSwap(false, true) {
		return
	}
	defer c.evicting.Store(false)
	target := c.capacity * 9 / 10
	for pass := 0; pass < 2 && c.size.Load() > target; pass++ {
		c.slots.Range(func(k, v any) bool {
			if v.(*cacheSlot).ref.Swap(false) {
				return true
			}
			id := k.(string)
			if c.slots.CompareAndDelete(id, v) {
				c.shards[shardOf(id)].Store(c.seq.Add(1))
				c.size.Add(-1)
			}
			return c.size.Load() > target
		})
	}
}
