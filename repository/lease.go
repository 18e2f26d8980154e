package repository

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
)

// Lease timing. A live holder renews its leases every leaseRenewEvery, each renewal good for
// leaseTerm, so a lease outlives a dead holder by at most leaseTerm. A lease interrupted by a
// restart or failover is held for restartGrace from when a process first finds it on the new
// server: its holder needs that long to reconnect and renew it or store its token. A promoted
// standby may lack the lease altogether (an asynchronous standby loses the last commits): there
// its holder restores it, and no lease is granted for restartGrace from the new timeline's first
// claim (claimSQL).
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

// restoreLeaseSQL writes lease l back (connection $1, version $2 with $3 failures, holder $4,
// taken $5 ms ago) if the token is still at that version and failure count: what the server
// lost, not a refresh that ended. A lease on another version gives way, as in leaseFree.
const restoreLeaseSQL = `INSERT INTO tokenguard_refresh_leases AS l (connection_id, version, holder, until, server_started, taken_at)
SELECT t.connection_id, t.version, $4::uuid, now() + $6 * interval '1 millisecond', pg_postmaster_start_time(),
       now() - $5 * interval '1 millisecond'
FROM tokenguard_tokens t JOIN tokenguard_connections c ON c.id = t.connection_id
LEFT JOIN tokenguard_refresh_failures f ON f.connection_id = t.connection_id AND f.version = t.version
WHERE c.name = $1 AND t.version = $2 AND coalesce(f.failures, 0) = $3
ON CONFLICT (connection_id) DO UPDATE SET holder = EXCLUDED.holder, until = EXCLUDED.until, taken_at = EXCLUDED.taken_at,
    version = EXCLUDED.version, server_started = EXCLUDED.server_started
    WHERE ` + leaseFree

// restoreLease writes l back under its connection's lock (restoreLeaseSQL).
func (r *TokenRepository) restoreLease(ctx context.Context, l *heldLease) error {
	return r.inLock(ctx, l.connection, 0, lockedHold, func(ctx context.Context, tx *gorm.DB) error {
		return tx.WithContext(ctx).Exec(restoreLeaseSQL, l.connection, l.version, l.failures, l.holder,
			time.Since(l.taken).Milliseconds(), leaseTerm.Milliseconds()).Error
	})
}

// heldLease is a lease its process still renews.
type heldLease struct {
	renewer    *leaseRenewer
	connection string
	version    int64
	failures   int       // the version's failure count when claimed: restored only while unchanged
	taken      time.Time // when claimed, for a restored lease's age
	holder     string
	presented  domain.Secret // the refresh token the holder presents, as claimed (kept with a rotation it stores)
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
// while there are any: a thousand refreshes in flight cost one renewal a tick. A lease the
// statement did not find is restored (restore), as the server may have lost it in a failover.
// At the same ticks it checks the rotations its process stored recently (kept.go).
type leaseRenewer struct {
	db        *gorm.DB
	restore   func(context.Context, *heldLease) error
	writeBack func(context.Context, []keptRotation) error
	mu        sync.Mutex
	holders   map[string]*heldLease
	kept      []keptRotation // oldest first
	running   bool
	busySince time.Time // since when the pool has had no idle connection for the check; run's
}

func (r *leaseRenewer) add(l *heldLease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.holders[l.holder] = l
	r.start()
}

// start runs the renewer if it is not running; r.mu is held.
func (r *leaseRenewer) start() {
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

// run renews until no lease is held and no rotation kept; a failed renewal or check is retried
// at the next tick.
func (r *leaseRenewer) run() {
	tick := time.NewTicker(leaseRenewEvery)
	defer tick.Stop()
	for range tick.C {
		r.mu.Lock()
		holders := slices.Collect(maps.Keys(r.holders))
		kept := slices.Clone(r.kept)
		live := len(holders) > 0 || len(kept) > 0
		r.running = live
		r.mu.Unlock()
		if !live {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), leaseTerm)
		if len(holders) > 0 {
			var renewed []string
			err := r.db.WithContext(ctx).Raw(`UPDATE tokenguard_refresh_leases
SET until = greatest(until, now() + ? * interval '1 millisecond'), server_started = pg_postmaster_start_time()
WHERE holder = ANY(?::uuid[]) RETURNING holder::text`, leaseTerm.Milliseconds(), "{"+strings.Join(holders, ",")+"}").Scan(&renewed).Error // UUIDs: no quoting
			if err == nil {
				r.restoreMissing(ctx, holders, renewed)
			}
		}
		if len(kept) > 0 && r.checkNow(time.Now()) {
			r.check(ctx, kept)
		}
		cancel()
	}
}

// restoreMissing restores the leases of holders that the renewal did not find and that are
// still held: a failover to a standby that never received them, or a refresh that just ended.
func (r *leaseRenewer) restoreMissing(ctx context.Context, holders, renewed []string) {
	for _, h := range holders {
		if slices.Contains(renewed, h) {
			continue
		}
		r.mu.Lock()
		l := r.holders[h]
		r.mu.Unlock()
		if l != nil {
			_ = r.restore(ctx, l) // retried at the next tick
		}
	}
}
