package repository

import (
	"context"
	"time"

	"github.com/tokenguard/tokenguard/usecase"
)

// ExpiringBefore lists the active connections whose token expires before
// t, soonest first.
func (r *TokenRepository) ExpiringBefore(ctx context.Context, t time.Time) ([]string, error) {
	var names []string
	err := r.db.WithContext(ctx).Raw(`SELECT c.name FROM tokens t JOIN connections c ON c.id = t.connection_id
		WHERE t.status = 'active' AND t.expiry < ? ORDER BY t.expiry, c.id`, t).Find(&names).Error
	if err != nil {
		return nil, storeError(ctx, "list expiring tokens", err)
	}
	return names, nil
}

// ObtainedBefore lists the active connections whose token was obtained
// before t, oldest first.
func (r *TokenRepository) ObtainedBefore(ctx context.Context, t time.Time) ([]string, error) {
	var names []string
	err := r.db.WithContext(ctx).Raw(`SELECT c.name FROM tokens t JOIN connections c ON c.id = t.connection_id
		WHERE t.status = 'active' AND t.obtained_at < ? ORDER BY t.obtained_at, c.id`, t).Find(&names).Error
	if err != nil {
		return nil, storeError(ctx, "list idle tokens", err)
	}
	return names, nil
}

// TryInLock is InLock without the wait: if another transaction holds the
// connection's lock it returns false at once and fn does not run.
func (r *TokenRepository) TryInLock(ctx context.Context, connectionID string, hold time.Duration,
	fn func(context.Context, usecase.LockedStore) error) (bool, error) {
	tx, err := r.beginLocked(ctx, connectionID, lockMode{try: true})
	if err != nil || tx == nil {
		return err != nil, err
	}
	return true, r.runLocked(ctx, tx, hold, func(ctx context.Context, l *LockedTokens) error { return fn(ctx, l) })
}
