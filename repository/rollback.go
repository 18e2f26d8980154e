package repository

import (
	"context"
)

// RecordRollback queues the connection.rolled_back event: the connection is stored at version
// stored although known was committed before. Every process finding the same loss writes the
// same event id, which receivers deduplicate on.
func (r *TokenRepository) RecordRollback(ctx context.Context, connection string, known, stored int64) error {
	err := r.db.WithContext(ctx).Exec(`INSERT INTO tokenguard_webhook_outbox (event_id, type, connection, data)
VALUES ('evt_' || md5('rolled_back ' || ? || ' ' || ?::bigint || ' ' || ?::bigint), 'connection.rolled_back', ?,
        jsonb_build_object('known_version', ?::bigint, 'stored_version', ?::bigint))
ON CONFLICT (event_id) DO NOTHING`, connection, known, stored, connection, known, stored).Error
	return storeError(ctx, "record the rollback of "+connection, err)
}
