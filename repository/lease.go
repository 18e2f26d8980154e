package repository

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"
)

// Lease timing. A live holder renews its leases every leaseRenewEvery, each renewal good for
// leaseTerm, so a lease outlives a dead holder by at most leaseTerm. A lease interrupted by a
// restart or failover is held for restartGrace from when a process first finds it on the new
// server: its holder needs that long to reconnect and renew it or store its token.
const (
	leaseTerm       = time.Second
	leaseRenewEvery = 300 * time.Millisecond
	restartGrace    = 5 * time.Second
)

// leaseRuns: lease l on token t's version runs on this server (Read).
const leaseRuns = `l.connection_id = t.connection_id AND l.version = t.version
    AND l.server_started = pg_postmaster_start_time() AND now() <= l.until`

// leaseFree: an existing lease l may be taken over by EXCLUDED, being on another version. A lease
// on the same version is never free by time: a holder that ran out of it left a request whose
// answer may still come, and the refresh token is presented again only after Fail recorded the
// lost answer (deleting the lease). A lease from another server is moved here, held for the grace.
const leaseFree = `(l.version <> EXCLUDED.version)`

// leaseUpsert ends the statements that take a lease.
const leaseUpsert = `ON CONFLICT (connection_id) DO UPDATE SET
    holder  = CASE WHEN ` + leaseFree + ` THEN EXCLUDED.holder ELSE l.holder END,
    until   = CASE WHEN ` + leaseFree + ` THEN EXCLUDED.until ELSE greatest(l.until, now() + $5 * interval '1 millisecond') END,
    taken_at = CASE WHEN ` + leaseFree + ` THEN now() ELSE l.taken_at END,
    version = EXCLUDED.version,
    server_started = EXCLUDED.server_started
    WHERE ` + leaseFree + ` OR l.server_started IS DISTINCT FROM EXCLUDED.server_started
RETURNING l.holder::text`

// heldLease is a lease its process still renews.
type heldLease struct {
	renewer    *leaseRenewer
	connection string
	version    int64
	holder     string
	once       sync.Once
	why        string // why the refresh token was not spent or stored (note); guarded by renewer.mu
}

// note records why the refresh ends without a stored token, for the history (lease_reason).
func (l *heldLease) note(why string) {
	l.renewer.mu.Lock()
	defer l.renewer.mu.Unlock()
	l.why = why
}

// end stops renewing the lease and, with release, deletes it and announces the unchanged
// version, so that waiting processes look again at once.
func (l *heldLease) end(release bool) {
	l.once.Do(func() {
		l.renewer.mu.Lock()
		why := l.why
		delete(l.renewer.holders, l.holder)
		l.renewer.mu.Unlock()
		if !release {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), lockedHold)
		defer cancel()
		_ = l.renewer.db.WithContext(ctx).Exec(`
WITH w AS (SELECT set_config('tokenguard.lease_reason', ?, true) AS why),
d AS (DELETE FROM tokenguard_refresh_leases WHERE holder = ?::uuid AND EXISTS (SELECT FROM w) RETURNING connection_id, version)
SELECT pg_notify(`+channelInSchema("?")+`, d.version || ' ' || c.name) FROM d JOIN tokenguard_connections c ON c.id = d.connection_id`,
			why, l.holder, ChangeChannel, ChangeChannel).Error // channelInSchema names it twice
	})
}

// leaseRenewer renews every lease its process holds in one statement every leaseRenewEvery,
// while there are any: a thousand refreshes in flight cost one renewal a tick.
type leaseRenewer struct {
	db      *gorm.DB
	mu      sync.Mutex
	holders map[string]*heldLease
	running bool
}

func (r *leaseRenewer) add(l *heldLease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.holders[l.holder] = l
	if !r.running {
		r.running = true
		go r.run()
	}
}

// whyOf is what this process's lease on connection's version noted ("": nothing, or none held).
func (r *leaseRenewer) whyOf(connection string, version int64) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range r.holders {
		if l.connection == connection && l.version == version {
			return l.why
		}
	}
	return ""
}

// run renews until no lease is held; a failed renewal is retried at the next tick.
func (r *leaseRenewer) run() {
	tick := time.NewTicker(leaseRenewEvery)
	defer tick.Stop()
	for range tick.C {
		r.mu.Lock()
		holders := slices.Collect(maps.Keys(r.holders))
		r.running = len(holders) > 0
		r.mu.Unlock()
		if len(holders) == 0 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), leaseTerm)
		_ = r.db.WithContext(ctx).Exec(`UPDATE tokenguard_refresh_leases
SET until = greatest(until, now() + ? * interval '1 millisecond'), server_started = pg_postmaster_start_time()
WHERE holder = ANY(?::uuid[])`, leaseTerm.Milliseconds(), "{"+strings.Join(holders, ",")+"}").Error // UUIDs: no quoting
		cancel()
	}
}
