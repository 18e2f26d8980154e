package repository

import (
	"gorm.io/gorm"

	"context"
	"fmt"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// reactivateHold bounds a reactivation once it holds the lock: the read
// came with the lock, what is left is one write and its commit.
const reactivateHold = 10 * time.Second

// Reactivate sets connection active again if it is marked needs_reauth
// and, when reason is not empty, marked so for that reason. Its tokens are
// not changed (they are sealed again, bound to the new version): the next
// refresh tells whether the grant is alive. It is the
// way back for grants marked dead for something that was not the grant's
// fault (invalid_client and the like).
//
// It takes the connection's advisory lock, the one refreshes take (wait
// bounds the wait, reported as domain.ErrLockTimeout), decides on the row
// read under the lock, and writes as Save does: the version bumped, the
// change announced on ChangeChannel so every process's cache drops what it
// holds, committed with the write. It returns the token as found under the
// lock and the version written, or 0 when it left the connection alone
// (already active, or needs_reauth for another reason).
func (r *TokenRepository) Reactivate(ctx context.Context, connection, reason string, wait time.Duration) (found domain.Token, version int64, err error) {
	err = r.inLock(ctx, connection, wait, reactivateHold, func(ctx context.Context, tx *gorm.DB) error {
		if found, err = getToken(ctx, tx, r.sealer, r.ids, connection); err != nil {
			return err
		}
		if found.Status != domain.StatusNeedsReauth || (reason != "" && found.StatusReason != reason) {
			return nil
		}
		id, err := r.ids.lookup(ctx, tx, connection)
		if err != nil {
			return err
		}
		// The credentials are bound to the version; the new one needs them
		// sealed again.
		st, err := sealed(r.sealer, found, seal{id: id, version: found.Version + 1})
		if err != nil {
			return err
		}
		row, err := oneRow(tx, `
WITH u AS (
    UPDATE tokenguard_tokens AS t SET
        status        = 'active',
        status_reason = '',
        version       = t.version + 1,
        access_token  = $4,
        refresh_token = $5,
        sealed_version = NULL,
        updated_at    = now()
    FROM tokenguard_connections c
    WHERE c.id = t.connection_id AND c.name = $1 AND t.version = $2 AND t.status = 'needs_reauth' AND c.id = $6
    RETURNING c.id AS lock_key, c.name, t.*
)
SELECT `+tokenColumns+` FROM u, LATERAL pg_notify(`+channelInSchema("$3")+`, u.version || ' ' || u.name)`,
			connection, found.Version, ChangeChannel, st.AccessToken.Reveal(), st.RefreshToken.Reveal(), id)
		if err != nil {
			return storeError(ctx, "reactivate", err)
		}
		if row == nil {
			// Cannot happen while the lock is held (every writer takes it),
			// unless the id changed (a row re-created by hand).
			r.ids.forget(connection)
			return fmt.Errorf("reactivate %s at version %d: %w", connection, found.Version, domain.ErrConflict)
		}
		version = row.Version
		return nil
	})
	if err != nil {
		return domain.Token{}, 0, err
	}
	return found, version, nil
}

// NeedingReauth lists, in name order, up to limit connections marked
// needs_reauth for reason whose names sort after after: one page of a
// walk that never loads the table at once. It reads without locking;
// Reactivate decides again under the lock.
func (r *TokenRepository) NeedingReauth(ctx context.Context, reason, after string, limit int) ([]string, error) {
	var names []string
	err := r.db.WithContext(ctx).Raw(`SELECT c.name FROM tokenguard_tokens t JOIN tokenguard_connections c ON c.id = t.connection_id
		WHERE t.status = 'needs_reauth' AND t.status_reason = ? AND c.name > ? ORDER BY c.name LIMIT ?`,
		reason, after, limit).Find(&names).Error
	if err != nil {
		return nil, storeError(ctx, "list connections needing re-authorisation", err)
	}
	return names, nil
}
