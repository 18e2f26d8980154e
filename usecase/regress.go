package usecase

import (
	"errors"
	"math"
	"sync"

	"github.com/tokenguard/tokenguard/domain"
)

// ReasonRolledBack is the needs_reauth reason of a connection whose
// stored token went back to an older version (a failover to a standby
// that had not received the newest one, a restore from backup) and whose
// grant the provider then rejected: the refresh token the database kept
// had already been rotated, and the rotated one is lost.
const ReasonRolledBack = "rolled_back"

// versionHistory is what a process knows of a connection's committed
// versions, across cache epochs: a version stored once cannot be stored
// again unless the database went back in time.
type versionHistory struct {
	mu    sync.Mutex
	known int64  // newest version known committed
	at    uint64 // tokenCache.seq when known became known
	epoch uint64 // cache epoch then
	// own is the newest version this process wrote or read itself (not
	// one only announced). A check after the lock is released compares
	// with it, and with a known version from an older cache epoch (heard
	// before the change listener last reconnected, as before a failover):
	// the pass's own last write (a needs_reauth, which the pass does not
	// report) may have been announced in the current one meanwhile.
	own  int64
	lost int64 // the stored version found behind known, until a newer one is known
}

// everything is the mark of a read made under the connection's lock:
// no version can be committed meanwhile, so every version known counts.
var everything = cacheMark{seq: math.MaxUint64}

// knew records that version of id was committed (written by this process
// or announced). Announced versions are recorded only for connections
// with a slot, so that an announcement still allocates nothing.
func (c *tokenCache) knew(id string, version int64, announced bool) {
	var slot *cacheSlot
	if announced {
		v, ok := c.slots.Load(id)
		if !ok {
			return
		}
		slot = v.(*cacheSlot)
	} else {
		slot = c.slot(id)
	}
	h := &slot.hist
	h.mu.Lock()
	h.learn(version, c)
	if !announced {
		h.own = max(h.own, version)
	}
	h.mu.Unlock()
}

func (h *versionHistory) learn(version int64, c *tokenCache) {
	if version > h.known {
		h.known, h.at, h.epoch = version, c.seq.Add(1), c.epoch.Load()
		if version > h.lost {
			h.lost = 0
		}
	}
}

// read records that a read of the store begun at m found version of id.
// A version below one known committed before the read began means the
// database lost commits: the first read that shows it reports it (once per
// lost history), and the stored version becomes what is known.
func (c *tokenCache) read(id string, version int64, m cacheMark) { c.check(id, version, m, false) }

// readAfterLock is read for a version read under the connection's lock
// that has been released since: only what this process wrote or read
// itself, or heard of before the listener last reconnected, counts (see
// versionHistory.own).
func (c *tokenCache) readAfterLock(id string, version int64) { c.check(id, version, everything, true) }

func (c *tokenCache) check(id string, version int64, m cacheMark, ownOnly bool) {
	if version < 1 {
		return
	}
	h := &c.slot(id).hist
	h.mu.Lock()
	known, regressed := h.known, version < h.known && h.at <= m.seq
	if ownOnly {
		regressed = version < h.own || version < h.known && h.epoch < c.epoch.Load()
		if version >= h.known || h.epoch >= c.epoch.Load() {
			known = h.own
		}
	}
	if regressed {
		h.known, h.at, h.epoch, h.own, h.lost = version, c.seq.Add(1), c.epoch.Load(), version, version
	} else {
		h.learn(version, c)
		h.own = max(h.own, version)
	}
	h.mu.Unlock()
	if regressed && c.onRegress != nil {
		c.onRegress(id, known, version)
	}
}

// rolledBack reports whether version of id, read under the connection's
// lock, is behind a version known committed, or was found so already.
func (c *tokenCache) rolledBack(id string, version int64) bool {
	c.read(id, version, everything)
	v, ok := c.slots.Load(id)
	if !ok {
		return false
	}
	h := &v.(*cacheSlot).hist
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lost != 0 && h.lost == version
}

// OnRolledBack is called, with an ERROR logged, when this process finds a
// connection stored at an older version than one it knew committed
// (known): the database went back in time, and the stored refresh token
// (at stored) has probably been spent already. Each process that knew
// says so once per loss. Set it before the use case is used.
func (u *RefreshTokenUseCase) OnRolledBack(fn func(connection string, known, stored int64)) {
	u.cache.onRegress = func(id string, known, stored int64) {
		u.opts.Logger.Error("connection's stored token went back to an older version: the database lost committed writes (failover to an asynchronous standby, restore); its refresh token is probably spent, and the grant needs a new consent if the provider rejects it",
			"connection", id, "known_version", known, "stored_version", stored)
		if fn != nil {
			fn(id, known, stored)
		}
	}
}

// reasonFor is the needs_reauth reason of t's grant rejected with err,
// read under the connection's lock: ReasonRolledBack when t is behind a
// version this process knew committed.
func (u *RefreshTokenUseCase) reasonFor(t domain.Token, err error) string {
	if errors.Is(err, domain.ErrGrantRevoked) && u.cache.rolledBack(t.Connection, t.Version) {
		return ReasonRolledBack
	}
	return reason(err)
}
