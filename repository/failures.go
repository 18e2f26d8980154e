package repository

import (
	"context"
	"fmt"

	"github.com/tokenguard/tokenguard/domain"
)

// failSQL records the failure episode of version $2 of connection $1's
// token (tokenguard_refresh_failures, migration 13), ends that version's
// refresh lease and announces its release (as the unchanged version), in
// one statement: the processes waiting for the refresh look again at once
// and find when the next attempt is due.
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
ended AS (DELETE FROM tokenguard_refresh_leases l USING f WHERE l.connection_id = f.connection_id AND l.version = f.version)
SELECT f.version::text FROM f, LATERAL pg_notify(` + channelInSchema("$11") + `, f.version || ' ' || $1::text)`

// Fail records, for the version of t, the refresh failure episode f (the
// backoff every process honours), ends t's refresh lease and commits. It
// fails with domain.ErrConflict, having written nothing, when the stored
// version is not t.Version any more.
func (l *LockedTokens) Fail(ctx context.Context, t domain.Token, f domain.RefreshFailure) error {
	if l.tx.ended {
		return errTxEnded
	}
	var got []string
	err := l.tx.execAndCommit(ctx, scanStrings(&got), failSQL, t.Connection, t.Version, f.Failures, f.Since, f.LastAt,
		nullTime(f.RetryAt), nullTime(f.ReplayUntil), f.HTTPStatus, f.Code, f.Failing, ChangeChannel)
	if err != nil {
		return storeError(ctx, "record refresh failure of "+t.Connection, err)
	}
	if len(got) == 0 {
		return fmt.Errorf("record refresh failure of %s at version %d: %w", t.Connection, t.Version, domain.ErrConflict)
	}
	return nil
}
