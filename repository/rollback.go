package repository

import (
	"context"
	"fmt"
)

// RecordRollback queues the connection.rolled_back webhook event: the
// connection is stored at version stored although version known was
// committed before (the database went back in time), so its refresh token
// is probably spent at the provider. Every process that finds the same
// loss writes the same event id, which receivers deduplicate on.
func (r *TokenRepository) RecordRollback(ctx context.Context, connection string, known, stored int64) error {
	err := r.db.WithContext(ctx).Exec(`INSERT INTO tokenguard_webhook_outbox (event_id, type, connection, data)
VALUES ('evt_' || md5('rolled_back ' || ? || ' ' || ?::bigint || ' ' || ?::bigint), 'connection.rolled_back', ?,
        jsonb_build_object('known_version', ?::bigint, 'stored_version', ?::bigint))
ON CONFLICT (event_id) DO NOTHING`, connection, known, stored, connection, known, stored).Error
	if err != nil {
		return storeError(ctx, fmt.Sprintf("record the rollback of %s", connection), err)
	}
	return nil
}
