package repository

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
)

// Once its lock is held, a locked transaction runs to its end whatever its caller does, so that a
// caller giving up cannot roll back a claim or a token half-way: lockedHold bounds the refresh
// path's, operatorHold an operator's (disconnect, reactivate, reseal). A lock wait gives up
// lockTimeoutMargin before its deadline.
const (
	lockedHold        = 5 * time.Second
	operatorHold      = 10 * time.Second
	lockTimeoutMargin = 20 * time.Millisecond
)

// inLock runs fn in a transaction of its own holding connection's advisory lock, and commits when
// fn returns nil; fn's error rolls back and is returned as it is. ctx and wait (0: ctx alone)
// bound the wait for the lock (domain.ErrLockTimeout); once it is held, hold bounds the rest.
func (r *TokenRepository) inLock(ctx context.Context, connection string, wait, hold time.Duration, fn func(ctx context.Context, tx *gorm.DB) error) error {
	if _, ok := r.db.Statement.ConnPool.(interface {
		Conn(context.Context) (*sql.Conn, error)
	}); !ok {
		// A savepoint would keep the lock, and the claim or token, until the caller's transaction ends.
		return fmt.Errorf("lock connection %s: the token repository is bound to %T, not to a connection pool", connection, r.db.Statement.ConnPool)
	}
	lockBy, bounded := ctx.Deadline()
	if wait > 0 && (!bounded || time.Until(lockBy) > wait+lockTimeoutMargin) {
		lockBy, bounded = time.Now().Add(wait+lockTimeoutMargin), true
	}
	if bounded {
		wait = time.Until(lockBy)
	}
	txCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), wait+hold)
	defer cancel()
	leave := context.AfterFunc(ctx, cancel) // until the lock is held, the caller may give up
	defer leave()
	op := "lock connection " + connection
	var fnErr error
	waiting, locked := false, false
	err := r.db.WithContext(txCtx).Transaction(func(tx *gorm.DB) error {
		locking := tx // its context's deadline bounds the lock wait
		if bounded {
			lockCtx, stopWait := context.WithDeadline(txCtx, lockBy)
			defer stopWait()
			locking = tx.WithContext(lockCtx)
		}
		waiting = true
		if err := r.WithAdvisoryLock(locking, connection); err != nil {
			return err
		}
		locked = true
		if !leave() && ctx.Err() != nil {
			return ctx.Err() // the caller gave up while the lock was waited for
		}
		fnErr = fn(txCtx, tx)
		return fnErr
	})
	switch {
	case fnErr != nil:
		return fnErr
	case errors.Is(err, domain.ErrNotFound):
		return fmt.Errorf("%s: %w", op, domain.ErrNotFound)
	case err != nil && waiting && !locked && bounded && !time.Now().Before(lockBy) && !errors.Is(ctx.Err(), context.Canceled):
		// The wait ran out: on a busy host the client's deadline can fire before lock_timeout.
		return fmt.Errorf("%s: %w", op, domain.ErrLockTimeout)
	case err != nil && ctx.Err() != nil:
		return storeError(ctx, op, err)
	}
	return storeError(txCtx, op, err)
}
