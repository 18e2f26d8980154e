package repository

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
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

// errBusy ends the transaction of a TryInLock that found the lock taken.
var errBusy = errors.New("connection lock busy")

// TryInLock is InLock without the wait: if another transaction holds the
// connection's lock it returns false at once and fn does not run.
func (r *TokenRepository) TryInLock(ctx context.Context, connectionID string, hold time.Duration,
	fn func(context.Context, *LockedTokens) error) (bool, error) {
	txCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), hold)
	defer cancel()
	var inner error
	err := r.db.WithContext(txCtx).Transaction(func(tx *gorm.DB) error {
		inner = r.tryLockAndRun(ctx, txCtx, tx, connectionID, fn)
		return inner
	})
	switch {
	case errors.Is(inner, errBusy):
		return false, nil
	case inner != nil:
		return true, inner
	case err != nil:
		return true, storeError(txCtx, "transaction", err)
	}
	return true, nil
}

func (r *TokenRepository) tryLockAndRun(ctx, txCtx context.Context, tx *gorm.DB, connectionID string,
	fn func(context.Context, *LockedTokens) error) error {
	found, ok, err := tryLockConnectionByName(tx.WithContext(ctx), connectionID)
	if err != nil {
		return storeError(ctx, "lock connection "+connectionID, err)
	}
	if !found {
		return fmt.Errorf("lock connection %s: %w", connectionID, domain.ErrNotFound)
	}
	if !ok {
		return errBusy
	}
	return fn(txCtx, r.locked(tx))
}
