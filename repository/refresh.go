package repository

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/usecase"
)

// The refresh path's transactions (usecase.TokenStore): Claim, Store and
// Fail each take the connection's advisory lock (WithAdvisoryLock), do
// one thing and commit before they return, so that no database connection
// is held across a call to the provider. Read (tokens.go) takes no lock.

// Claim leases the refresh of seen for answerWithin: under the lock it
// re-reads the token and takes the lease only if the token is still seen
// (its version and its failure record), active, and no other holder's
// request for that version is unresolved. The lease, in refresh_leases,
// tells every process that seen's refresh token is about to be presented;
// this process renews it until Claim.End is called.
func (r *TokenRepository) Claim(ctx context.Context, seen domain.Token, answerWithin time.Duration) (usecase.Claim, error) {
	var (
		c    usecase.Claim
		rows []claimRow
	)
	holder := newHolder()
	err := r.inLock(ctx, seen.Connection, 0, lockedHold, func(ctx context.Context, tx *gorm.DB) error {
		err := tx.Raw(claimSQL, seen.Connection, seen.Version, holder, (max(answerWithin, 0) + leaseTerm).Milliseconds(),
			restartGrace.Milliseconds(), seen.Failure.Failures, string(domain.StatusActive)).Find(&rows).Error
		if err != nil {
			return storeError(ctx, "claim refresh of "+seen.Connection, err)
		}
		if len(rows) == 0 {
			return fmt.Errorf("connection %q: %w", seen.Connection, domain.ErrNotFound)
		}
		// Opened before the commit: a token that cannot be (a key
		// missing, a ciphertext altered) rolls the lease back with it.
		c.Token, err = rows[0].Read.Token.domain(r.sealer)
		return err
	})
	if err != nil {
		return usecase.Claim{}, err
	}
	row := rows[0].Read
	r.ids.put(&row.Token)
	c.Lease = usecase.Lease{Running: row.Leased, Abandoned: row.Abandoned}
	if row.LeaseAgeMs != nil {
		c.Lease.Age = time.Duration(*row.LeaseAgeMs) * time.Millisecond
	}
	switch took := rows[0].Took; {
	case took != nil && *took == holder:
		lease := &heldLease{renewer: r.leases, connection: seen.Connection, version: seen.Version, holder: holder}
		r.leases.add(lease)
		c.End, c.Why = lease.end, lease.note
	case took != nil:
		// A lease taken on another server (a restart, a failover), held
		// for its holder for the grace.
		c.Lease.Running = true
	}
	return c, nil
}

// claimSQL is Claim's statement: the re-read of connection $1's token with
// its lease, and the lease of version $2 for holder $3, its term $4 ms (a
// lease found from another server kept for its holder for the grace $5
// ms), if the token is still at it with $6 failures on record, $7
// (active), and no other holder's request for it unresolved; took is the
// lease's holder afterwards, NULL when none was asked for.
var claimSQL = `WITH cur AS (` + selectTokenLeased + ` WHERE c.name = $1),
took AS (
    INSERT INTO tokenguard_refresh_leases AS l (connection_id, version, holder, until, server_started)
    SELECT cur.lock_key, cur.version, $3::uuid, now() + $4 * interval '1 millisecond', pg_postmaster_start_time() FROM cur
    WHERE cur.version = $2 AND cur.failures = $6 AND cur.status = $7 AND NOT cur.leased AND NOT cur.abandoned
    ` + leaseUpsert + `
)
SELECT cur.*, (SELECT holder FROM took) AS took FROM cur`

// claimRow is a row of claimSQL.
type claimRow struct {
	Read leasedTokenRow `gorm:"embedded"`
	Took *string
}

// Store writes t over the stored token if the stored version is still
// t.Version, bumps the version, ends the refresh leases of older versions
// and announces the change, in one statement under the lock. An empty
// refresh token keeps the stored one. It fails with domain.ErrConflict,
// having written nothing, when the stored version is not t.Version.
func (r *TokenRepository) Store(ctx context.Context, t domain.Token) (domain.Token, error) {
	var out domain.Token
	err := r.inLock(ctx, t.Connection, 0, lockedHold, func(ctx context.Context, tx *gorm.DB) error {
		if t.RefreshToken.IsZero() {
			// The kept refresh token is sealed again with the new version.
			cur, err := getToken(ctx, tx, r.sealer, r.ids, t.Connection)
			if err != nil {
				return err
			}
			t.RefreshToken = cur.RefreshToken
		}
		id, err := r.ids.lookup(ctx, tx, t.Connection)
		if err != nil {
			return err
		}
		at := seal{id: id, version: t.Version + 1} // bound to the version the write gives the row
		st, err := sealed(r.sealer, t, at)
		if err != nil {
			return err
		}
		row, err := oneRow(tx, saveSQL, saveArgs(st, at)...)
		if err != nil {
			return storeError(ctx, "save token", err)
		}
		if row == nil {
			r.ids.forget(t.Connection) // or the id changed: read again by the next write
			return fmt.Errorf("save token of %s at version %d: %w", t.Connection, t.Version, domain.ErrConflict)
		}
		out, err = row.domain(r.sealer)
		return err
	})
	return out, err
}

// failSQL records the failure episode of version $2 of connection $1's
// token (tokenguard_refresh_failures), ends that version's refresh lease
// and announces its release (as the unchanged version), in one statement:
// the processes waiting for the refresh look again at once and find when
// the next attempt is due. $12 is why, as this process's lease on it noted
// (Claim.Why), for the history (migration 000026).
var failSQL = `
WITH f AS (
    INSERT INTO tokenguard_refresh_failures AS f
        (connection_id, version, failures, since, last_at, retry_at, replay_until, http_status, code, failing)
    SELECT t.connection_id, t.version, $3, $4, $5, $6, $7, $8, $9, $10
    FROM tokenguard_tokens t JOIN tokenguard_connections c ON c.id = t.connection_id
    WHERE c.name = $1 AND t.version = $2
    ON CONFLICT (connection_id) DO UPDATE SET
        version = EXCLUDED.version, failures = EXCLUDED.failures, since = EXCLUDED.since,
        last_at = EXCLUDED.last_at, retry_at = EXCLUDED.retry_at, replay_until = EXCLUDED.replay_until,
        http_status = EXCLUDED.http_status, code = EXCLUDED.code, failing = EXCLUDED.failing
    RETURNING f.connection_id, f.version
),
why AS (SELECT set_config('tokenguard.lease_reason', $12, true) AS why),
ended AS (DELETE FROM tokenguard_refresh_leases l USING f WHERE l.connection_id = f.connection_id AND l.version = f.version
    AND EXISTS (SELECT FROM why))
SELECT f.version::text FROM f, LATERAL pg_notify(` + channelInSchema("$11") + `, f.version || ' ' || $1::text)`

// Fail records, for the version of t, the refresh failure episode f (the
// backoff every process honours) and ends t's refresh lease. It fails with
// domain.ErrConflict, having written nothing, when the stored version is
// not t.Version any more.
func (r *TokenRepository) Fail(ctx context.Context, t domain.Token, f domain.RefreshFailure) error {
	return r.inLock(ctx, t.Connection, 0, lockedHold, func(ctx context.Context, tx *gorm.DB) error {
		var got []string
		err := tx.Raw(failSQL, t.Connection, t.Version, f.Failures, f.Since, f.LastAt,
			nullTime(f.RetryAt), nullTime(f.ReplayUntil), f.HTTPStatus, f.Code, f.Failing, ChangeChannel,
			r.leases.whyOf(t.Connection, t.Version)).Find(&got).Error
		if err != nil {
			return storeError(ctx, "record refresh failure of "+t.Connection, err)
		}
		if len(got) == 0 {
			return fmt.Errorf("record refresh failure of %s at version %d: %w", t.Connection, t.Version, domain.ErrConflict)
		}
		return nil
	})
}
