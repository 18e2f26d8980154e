package repository

import (
	"context"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
)

// Reactivate sets connection active again if it is marked needs_reauth (for reason, when not
// empty), keeping its tokens: the way back for grants marked dead for something not their fault.
// It decides under the lock (wait bounds the wait), writes as Store does, and returns the token as
// found and the version written, 0 when it changed nothing.
func (r *TokenRepository) Reactivate(ctx context.Context, connection, reason string, wait time.Duration) (found domain.Token, version int64, err error) {
	err = r.inLock(ctx, connection, wait, operatorHold, func(ctx context.Context, tx *gorm.DB) error {
		if found, err = r.get(ctx, tx, connection); err != nil {
			return err
		}
		if found.Status != domain.StatusNeedsReauth || (reason != "" && found.StatusReason != reason) {
			return nil
		}
		row, err := r.writeNext(ctx, tx, "reactivate", found, `
WITH u AS (
    UPDATE tokenguard_tokens AS t SET status = 'active', status_reason = '', version = t.version + 1,
        access_token = $4, refresh_token = $5, sealed_version = NULL, updated_at = now()
    FROM tokenguard_connections c
    WHERE c.id = t.connection_id AND c.name = $1 AND t.version = $2 AND t.status = 'needs_reauth' AND c.id = $6
    RETURNING c.id AS lock_key, c.name, t.*
)
`+notifiedTokens("$3"), func(st domain.Token, id int32) []any {
			return []any{connection, found.Version, ChangeChannel, st.AccessToken.Reveal(), st.RefreshToken.Reveal(), id}
		})
		if err != nil {
			return err
		}
		version = row.Version
		return nil
	})
	if err != nil {
		return domain.Token{}, 0, err
	}
	return found, version, nil
}

// NeedingReauth lists, by name, up to limit connections marked needs_reauth for reason whose
// names sort after after. It takes no lock: Reactivate decides again under it.
func (r *TokenRepository) NeedingReauth(ctx context.Context, reason, after string, limit int) ([]string, error) {
	return allRows(ctx, r.db, "list connections needing re-authorisation", asIs[string], `SELECT c.name FROM tokenguard_tokens t JOIN tokenguard_connections c ON c.id = t.connection_id
		WHERE t.status = 'needs_reauth' AND t.status_reason = ? AND c.name > ? ORDER BY c.name LIMIT ?`,
		reason, after, limit)
}

// RecordRollback queues the connection.rolled_back event: the connection is stored at version
// stored although known was committed before. Every process finding the same loss writes the
// same event id, which receivers deduplicate on.
func (r *TokenRepository) RecordRollback(ctx context.Context, connection string, known, stored int64) error {
	return exec(ctx, r.db, "record the rollback of "+connection, `INSERT INTO tokenguard_webhook_outbox (event_id, type, connection, data)
VALUES ('evt_' || md5('rolled_back ' || ? || ' ' || ?::bigint || ' ' || ?::bigint), 'connection.rolled_back', ?,
        jsonb_build_object('known_version', ?::bigint, 'stored_version', ?::bigint))
ON CONFLICT (event_id) DO NOTHING`, connection, known, stored, connection, known, stored)
}
