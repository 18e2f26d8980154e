package repository

import (
	"context"
	"fmt"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// Lease records in refresh_leases (migration 7) that t's refresh token is
// about to be presented at the provider, for at most d, and commits it at
// once on a pool connection: not in the lock's transaction, whose session
// may end while the provider call is in flight (a terminated backend, a
// Postgres restart) and take the lock with it. The next holder of the lock
// then finds the lease and gets domain.ErrRefreshInProgress instead of
// presenting the same refresh token, which a strict provider would take
// for a reuse and answer by revoking the grant.
//
// A lease names the version it was taken for, so storing a newer version
// ends it without a write; release ends it early, for a refresh whose
// token was not spent. The lease is durable (a synchronous commit) before
// Lease returns: a Postgres restart must not forget it.
func (l *LockedTokens) Lease(ctx context.Context, t domain.Token, d time.Duration) (release func(), err error) {
	if l.tx.ended {
		return nil, errTxEnded
	}
	var holder []string
	err = l.pool.WithContext(ctx).Raw(`
INSERT INTO refresh_leases AS l (connection_id, version, holder, until)
SELECT c.id, ?, gen_random_uuid(), now() + ? * interval '1 millisecond' FROM connections c WHERE c.name = ?
ON CONFLICT (connection_id) DO UPDATE
    SET version = EXCLUDED.version, holder = EXCLUDED.holder, until = EXCLUDED.until
    WHERE l.version <> EXCLUDED.version OR l.until <= now()
RETURNING l.holder::text`, t.Version, d.Milliseconds(), t.Connection).Scan(&holder).Error
	if err != nil {
		return nil, storeError(ctx, "lease refresh of "+t.Connection, err)
	}
	if len(holder) == 0 {
		return nil, fmt.Errorf("lease refresh of %s at version %d: %w", t.Connection, t.Version, domain.ErrRefreshInProgress)
	}
	pool := l.pool
	return func() {
		// Bounded on its own: the caller may have given up, and a lease
		// left behind only delays the next refresh until it runs out.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		_ = pool.WithContext(ctx).Exec(`DELETE FROM refresh_leases
WHERE connection_id = (SELECT id FROM connections WHERE name = ?) AND holder = ?::uuid`, t.Connection, holder[0]).Error
	}, nil
}
