package repository

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
)

// Lease timing. A live holder renews its lease every leaseRenewEvery, each
// renewal good for leaseTerm, so a lease outlives a dead holder by at most
// leaseTerm. After the database server (re)started, every lease holds for
// restartGrace at least: its holder lost its sessions to the restart and
// needs that long to reconnect and renew (or store its rotated token), and
// must not be overtaken meanwhile.
const (
	leaseTerm       = time.Second
	leaseRenewEvery = 300 * time.Millisecond
	restartGrace    = 5 * time.Second
)

// Lease records in refresh_leases (migration 7) that t's refresh token is
// about to be presented at the provider, and commits it at once on a pool
// connection: not in the lock's transaction, whose session may end while
// the provider call is in flight (a terminated backend, a Postgres restart)
// and take the lock with it. The next holder of the lock then finds the
// lease and gets domain.ErrRefreshInProgress instead of presenting the same
// refresh token, which a strict provider would take for a reuse and answer
// by revoking the grant.
//
// The lease is renewed in the background until end is called, so it lasts
// as long as its holder lives and no longer: a process killed mid-refresh
// holds up the others for leaseTerm (a second) at most. A lease names the
// version it was taken for, so storing a newer version ends it for
// everyone else; end with release true also deletes it, for a refresh
// whose token was not spent. Commits are synchronous: a restart does not
// forget a lease.
func (l *LockedTokens) Lease(ctx context.Context, t domain.Token) (end func(release bool), err error) {
	if l.tx.ended {
		return nil, errTxEnded
	}
	holder, err := l.takeLease(ctx, t)
	if err != nil {
		return nil, storeError(ctx, "lease refresh of "+t.Connection, err)
	}
	if holder == "" {
		return nil, fmt.Errorf("lease refresh of %s at version %d: %w", t.Connection, t.Version, domain.ErrRefreshInProgress)
	}
	lease := &refreshLease{pool: l.pool, connection: t.Connection, holder: holder, stop: make(chan struct{})}
	lease.renewing.Add(1)
	go lease.renew()
	return lease.end, nil
}

// leaseRunsUntil is when a lease l runs out: its until, but never sooner
// than restartGrace after the server started.
var leaseRunsUntil = fmt.Sprintf("greatest(l.until, pg_postmaster_start_time() + interval '%d milliseconds')",
	restartGrace.Milliseconds())

// takeLeaseSQL takes the lease on $2 of connection $1 unless another
// holder's lease on that version runs; it returns the new holder's id, or
// no row.
var takeLeaseSQL = `
INSERT INTO refresh_leases AS l (connection_id, version, holder, until)
SELECT c.id, $2, gen_random_uuid(), now() + $3 * interval '1 millisecond' FROM connections c WHERE c.name = $1
ON CONFLICT (connection_id) DO UPDATE
    SET version = EXCLUDED.version, holder = EXCLUDED.holder, until = EXCLUDED.until
    WHERE l.version <> EXCLUDED.version OR now() > ` + leaseRunsUntil + `
RETURNING l.holder::text`

// takeLease runs takeLeaseSQL on a pool connection: on pgx in exec mode,
// one round trip on any connection (the statement is not worth a prepare
// round trip on each pool connection it meets), else through GORM. It
// returns "" when another holder's lease runs.
func (l *LockedTokens) takeLease(ctx context.Context, t domain.Token) (string, error) {
	args := []any{t.Connection, t.Version, leaseTerm.Milliseconds()}
	if l.tx.plain == nil {
		if pool, ok := l.pool.Statement.ConnPool.(interface {
			Conn(context.Context) (*sql.Conn, error)
		}); ok {
			conn, err := pool.Conn(ctx)
			if err != nil {
				return "", err
			}
			defer conn.Close()
			var holder string
			err = conn.Raw(func(dc any) error {
				pc, err := pgxConn(dc)
				if err != nil {
					return err
				}
				err = pc.QueryRow(ctx, takeLeaseSQL, append([]any{pgx.QueryExecModeExec}, args...)...).Scan(&holder)
				if errors.Is(err, pgx.ErrNoRows) {
					return nil
				}
				return err
			})
			return holder, err
		}
	}
	var holder []string
	if err := l.pool.WithContext(ctx).Raw(takeLeaseSQL, args...).Scan(&holder).Error; err != nil || len(holder) == 0 {
		return "", err
	}
	return holder[0], nil
}

// refreshLease is a lease its holder still renews.
type refreshLease struct {
	pool       *gorm.DB
	connection string
	holder     string
	stop       chan struct{}
	once       sync.Once
	renewing   sync.WaitGroup
}

// renew extends the lease every leaseRenewEvery until end. A failed
// renewal (the database is away) is retried at the next tick: the lease
// still runs for what is left of its term, and for restartGrace after the
// server is back if it restarted.
func (l *refreshLease) renew() {
	defer l.renewing.Done()
	tick := time.NewTicker(leaseRenewEvery)
	defer tick.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), leaseRenewEvery)
		_ = l.pool.WithContext(ctx).Exec(`UPDATE refresh_leases SET until = now() + ? * interval '1 millisecond'
WHERE connection_id = (SELECT id FROM connections WHERE name = ?) AND holder = ?::uuid`,
			leaseTerm.Milliseconds(), l.connection, l.holder).Error
		cancel()
	}
}

// end stops the renewals and, with release, deletes the lease.
func (l *refreshLease) end(release bool) {
	l.once.Do(func() {
		close(l.stop)
		l.renewing.Wait()
		if !release {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), rollbackTimeout)
		defer cancel()
		_ = l.pool.WithContext(ctx).Exec(`DELETE FROM refresh_leases
WHERE connection_id = (SELECT id FROM connections WHERE name = ?) AND holder = ?::uuid`, l.connection, l.holder).Error
	})
}

// Leased reports whether a refresh lease on t's version is still running:
// another process may be presenting its refresh token at the provider.
func (r *TokenRepository) Leased(ctx context.Context, t domain.Token) (bool, error) {
	var live []bool
	err := r.db.WithContext(ctx).Raw(`
SELECT true FROM refresh_leases l JOIN connections c ON c.id = l.connection_id
WHERE c.name = ? AND l.version = ? AND now() <= `+leaseRunsUntil,
		t.Connection, t.Version).Scan(&live).Error
	if err != nil {
		return false, storeError(ctx, "read refresh lease of "+t.Connection, err)
	}
	return len(live) > 0, nil
}
