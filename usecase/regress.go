package usecase

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/tokenguard/tokenguard/domain"
)

// ReasonRolledBack is the needs_reauth reason of a connection whose stored token went back to an
// older version (a failover, a restore) and whose grant the provider then rejected.
const ReasonRolledBack = "rolled_back"

// versionHistory is what a process knows of a connection's committed versions, across cache
// epochs: a version stored once cannot be stored again unless the database went back in time.
type versionHistory struct {
	mu    sync.Mutex
	known int64  // newest version known committed
	at    uint64 // tokenCache.seq when known became known
	epoch uint64 // cache epoch then
	// own is the newest version this process wrote or read itself. A check after the lock compares
	// with it (and known from an older epoch): the pass's own write may have been announced meanwhile.
	own  int64
	lost int64 // the stored version found behind known, until a newer one is known
}

// everything marks a read under the connection's lock: every version known counts.
var everything = cacheMark{seq: math.MaxUint64}

// knew records that version of id was committed; announced ones only for connections with a slot,
// so an announcement allocates nothing.
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

// read records that a read begun at m found version of id. A version below one known committed
// before the read began means the database lost commits: reported once, and the stored version
// becomes what is known. afterLock: read under a lock released since (see versionHistory.own).
func (c *tokenCache) read(id string, version int64, m cacheMark, afterLock bool) {
	if version < 1 {
		return
	}
	h := &c.slot(id).hist
	h.mu.Lock()
	known, regressed := h.known, version < h.known && h.at <= m.seq
	if afterLock {
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

// rolledBack reports whether version of id, read under the lock, is behind one known committed, or
// was found so already.
func (c *tokenCache) rolledBack(id string, version int64) bool {
	c.read(id, version, everything, false)
	v, ok := c.slots.Load(id)
	if !ok {
		return false
	}
	h := &v.(*cacheSlot).hist
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lost != 0 && h.lost == version
}

// OnRolledBack sets fn, called with an ERROR logged when a connection is found stored at an older
// version than one known committed: its refresh token has probably been spent. Set it before use.
func (u *RefreshTokenUseCase) OnRolledBack(fn func(connection string, known, stored int64)) {
	u.cache.onRegress = func(id string, known, stored int64) {
		u.opts.Logger.Error("connection's stored token went back to an older version: the database lost committed writes (failover to an asynchronous standby, restore); its refresh token is probably spent, and the grant needs a new consent if the provider rejects it",
			"connection", id, "known_version", known, "stored_version", stored)
		if fn != nil {
			fn(id, known, stored)
		}
	}
}

// reasonFor is the needs_reauth reason of t's grant rejected with err: ReasonRolledBack when t is
// behind a version known committed, else the OAuth2 error code, never a response body.
func (u *RefreshTokenUseCase) reasonFor(t domain.Token, err error) string {
	if errors.Is(err, domain.ErrGrantRevoked) && u.cache.rolledBack(t.Connection, t.Version) {
		return ReasonRolledBack
	}
	if pe, ok := errors.AsType[*domain.ProviderError](err); ok && pe.Code != "" {
		if pe.Evidence == domain.EvidenceFingerprint {
			return fmt.Sprintf("%s (HTTP %d, the provider's answer to a refresh token that cannot exist)", pe.Code, pe.HTTPStatus)
		}
		return pe.Code
	}
	return "grant rejected"
}
