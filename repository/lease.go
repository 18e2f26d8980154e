package repository

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/usecase"
)

// Lease timing. A live holder's process renews its leases every
// leaseRenewEvery, each renewal good for leaseTerm, so a lease outlives a
// dead holder by at most leaseTerm. A lease that a server restart or a
// failover interrupted (taken on a server that started at another time) is
// held for restartGrace from the moment a process first finds it on the new
// server: its holder lost its sessions and needs that long to reconnect and
// renew it, or to store its rotated token, and must not be overtaken
// meanwhile.
const (
	leaseTerm       = time.Second
	leaseRenewEvery = 300 * time.Millisecond
	restartGrace    = 5 * time.Second
)

// Lease records in the locked transaction, in refresh_leases, that t's
// refresh token is about to be presented at the provider, and commits:
// the lock and its pool connection are let go, and the provider call runs
// with no database connection held. While the lease runs, no other holder
// of the lock presents the same refresh token (it gets
// domain.ErrRefreshInProgress, and waits for the announcement of the
// rotated token or for the lease to end); a strict provider would take a
// second presentation for a reuse and revoke the grant.
//
// The lease covers the wait for the provider's answer (call, the answer
// deadline) and leaseTerm more from the start; the holder's process renews
// it in the background until end is called. Covering the wait up front
// keeps the lease safe when the renewals wait for a pool connection behind
// a burst of refreshes, or the database is away. A lease that runs out on
// the same version is abandoned, not free (leaseFree): its holder's
// request is unresolved, and the use case records its answer as lost
// before anyone presents the refresh token again.
// Storing a newer version ends the lease for everyone (Save deletes it in
// the writing statement); end(true) deletes it and announces the release,
// for a refresh whose token was not spent.
func (l *LockedTokens) Lease(ctx context.Context, t domain.Token, call time.Duration) (end func(release bool), err error) {
	if bid := l.tx.bid; bid != nil {
		return l.bidLease(t)
	}
	if l.tx.ended {
		return nil, errTxEnded
	}
	if l.tx.leaseSeen(t.Version) {
		return nil, leaseRefused(t, domain.ErrRefreshInProgress)
	}
	holder := newHolder()
	var got []string
	if err := l.tx.execAndCommit(ctx, scanStrings(&got), takeLeaseSQL, t.Connection, t.Version, holder, (max(call, 0) + leaseTerm).Milliseconds(), restartGrace.Milliseconds()); err != nil {
		return nil, storeError(ctx, "lease refresh of "+t.Connection, err)
	}
	if len(got) == 0 || got[0] != holder {
		return nil, leaseRefused(t, domain.ErrRefreshInProgress)
	}
	lease := &heldLease{renewer: l.leases, connection: t.Connection, version: t.Version, holder: holder}
	l.leases.add(holder)
	return lease.end, nil
}

// bidLease is Lease in a transaction opened with a bid: it hands out the
// lease the bid took, if it took one for t's version.
func (l *LockedTokens) bidLease(t domain.Token) (func(bool), error) {
	bid := l.tx.bid
	switch {
	case bid.won && bid.version == t.Version && !bid.handed:
		bid.handed = true
		lease := l.tx.bidLease(l.leases, t.Connection)
		l.leases.add(bid.holder)
		return lease.end, nil
	case bid.other || l.tx.leaseSeen(t.Version):
		return nil, leaseRefused(t, domain.ErrRefreshInProgress)
	}
	return nil, leaseRefused(t, usecase.ErrBidMissed)
}

// leaseSeen: the lock's read saw another holder's lease on version.
func (tx *lockTx) leaseSeen(version int64) bool {
	return tx.leased && tx.first != nil && tx.first.Version == version
}

func leaseRefused(t domain.Token, err error) error {
	return fmt.Errorf("lease refresh of %s at version %d: %w", t.Connection, t.Version, err)
}

// bidLease is the lease tx's bid took.
func (tx *lockTx) bidLease(renewer *leaseRenewer, connection string) *heldLease {
	return &heldLease{renewer: renewer, connection: connection, version: tx.bid.version, holder: tx.bid.holder}
}

// newHolder names a lease's holder: a random UUID, made here so that the
// statement taking the lease can tell whose lease it returns.
func newHolder() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // variant
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// leasedSQL, read with the lock (locktx.go), says whether another holder's
// lease on the stored version runs on this server: then a refresh can be
// refused without a write. A lease from another server is left to
// takeLeaseSQL, which holds it for the grace or takes it over.
const leasedSQL = `SELECT EXISTS (SELECT FROM tokenguard_tokens t JOIN tokenguard_connections c ON c.id = t.connection_id
    JOIN tokenguard_refresh_leases l ON ` + leaseRuns + `
    WHERE c.name = $1)`

// leaseRuns is the condition under which lease l on token t's version runs
// on this server (leasedSQL, GetWithLease).
const leaseRuns = `l.connection_id = t.connection_id AND l.version = t.version
    AND l.server_started = pg_postmaster_start_time() AND now() <= l.until`

// leaseFree is the condition under which an existing lease l may be taken
// over by EXCLUDED: it is on another version (stored since). A lease on
// the same version is never free by time: a holder that ran out of it
// (died, or lost the database past the answer deadline) left a request
// whose answer may still be on its way or queued at the provider, and the
// version's refresh token is presented again only after the use case has
// recorded the lost answer (Fail deletes the lease). A lease from another
// server (a restart, a failover) is moved to this one and held at least
// for the grace, for its holder to renew it.
const leaseFree = `(l.version <> EXCLUDED.version)`

// takeLeaseSQL takes the lease on version $2 of connection $1 for holder
// $3 unless another holder's lease on that version runs, and returns the
// lease's holder afterwards: $3 if it was taken. A lease found from
// another server is kept for its holder, its term set to the grace $5 ms
// from now.
var takeLeaseSQL = `
INSERT INTO tokenguard_refresh_leases AS l (connection_id, version, holder, until, server_started)
SELECT c.id, $2, $3::uuid, now() + $4 * interval '1 millisecond', pg_postmaster_start_time() FROM tokenguard_connections c WHERE c.name = $1
` + leaseUpsert

// bidLeaseSQL is takeLeaseSQL for a bid, sent with the lock before the
// re-read is seen (pipelineLock): it takes the lease only if the stored
// token is still at version $2, not $6 (needs_reauth), with no failure on
// record for that version, and only if the try statement recorded that
// the lock was granted.
var bidLeaseSQL = `
INSERT INTO tokenguard_refresh_leases AS l (connection_id, version, holder, until, server_started)
SELECT c.id, t.version, $3::uuid, now() + $4 * interval '1 millisecond', pg_postmaster_start_time()
FROM tokenguard_connections c JOIN tokenguard_tokens t ON t.connection_id = c.id
WHERE c.name = $1 AND t.version = $2 AND t.status <> $6
    AND current_setting('tokenguard.locked', true) = 'true'
    AND NOT EXISTS (SELECT FROM tokenguard_refresh_failures f WHERE f.connection_id = c.id AND f.version = t.version)
` + leaseUpsert

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
}

// end stops renewing the lease and, with release, deletes it and announces
// the release on the change channel (as the unchanged version), so that
// processes waiting for the refresh look again at once.
func (l *heldLease) end(release bool) {
	l.once.Do(func() {
		l.renewer.remove(l.holder)
		if !release {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), rollbackTimeout)
		defer cancel()
		_ = l.renewer.db.WithContext(ctx).Exec(`
WITH d AS (DELETE FROM tokenguard_refresh_leases WHERE holder = ?::uuid RETURNING connection_id, version)
SELECT pg_notify(`+channelInSchema("?")+`, d.version || ' ' || c.name) FROM d JOIN tokenguard_connections c ON c.id = d.connection_id`,
			l.holder, ChangeChannel, ChangeChannel).Error // channelInSchema names it twice
	})
}

// leaseRenewer renews every lease its process holds, all in one statement
// every leaseRenewEvery, on a pool connection it takes for that statement
// alone: a thousand refreshes in flight cost one renewal a tick, not a
// thousand. It runs while there are leases to renew.
type leaseRenewer struct {
	db      *gorm.DB
	mu      sync.Mutex
	holders map[string]struct{}
	running bool
}

func (r *leaseRenewer) add(holder string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.holders == nil {
		r.holders = map[string]struct{}{}
	}
	r.holders[holder] = struct{}{}
	if !r.running {
		r.running = true
		go r.run()
	}
}

func (r *leaseRenewer) remove(holder string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.holders, holder)
}

// held lists the holders to renew, or reports false (and stops the
// renewer) when there are none.
func (r *leaseRenewer) held() ([]string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.holders) == 0 {
		r.running = false
		return nil, false
	}
	return slices.Collect(maps.Keys(r.holders)), true
}

// run renews until no lease is held. A failed renewal (the database is
// away) is retried at the next tick: the lease still runs for what is left
// of its term, and after a restart or failover for the grace.
func (r *leaseRenewer) run() {
	tick := time.NewTicker(leaseRenewEvery)
	defer tick.Stop()
	for range tick.C {
		holders, ok := r.held()
		if !ok {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), leaseTerm)
		_ = r.db.WithContext(ctx).Exec(`UPDATE tokenguard_refresh_leases
SET until = greatest(until, now() + ? * interval '1 millisecond'), server_started = pg_postmaster_start_time()
WHERE holder = ANY(?::uuid[])`, leaseTerm.Milliseconds(), pgTextArray(holders)).Error
		cancel()
	}
}

// pgTextArray is a text[] parameter in Postgres' array syntax, which
// every driver passes as text (the values here are UUIDs: no quoting).
func pgTextArray(v []string) string {
	return "{" + strings.Join(v, ",") + "}"
}

// scanStrings collects a one-column text result.
func scanStrings(out *[]string) func(rowScanner) error {
	return func(rows rowScanner) error {
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				return err
			}
			*out = append(*out, s)
		}
		return rows.Err()
	}
}
