package repository

import (
	"context"
	"errors"
	"fmt"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
)

// plainTx is a lockTx on a database/sql driver other than pgx: a GORM
// transaction that runs the statements of the pipelined path one at a time
// and takes the exclusive lock with WithAdvisoryLock.
type plainTx struct {
	tx      *gorm.DB
	cancel  context.CancelFunc
	aborted bool // a statement failed: COMMIT would roll back
}

// beginPlain is beginLocked on the GORM path.
func (r *TokenRepository) beginPlain(ctx context.Context, connection string, mode lockMode) (*lockTx, error) {
	op := "lock connection " + connection
	// database/sql rolls a transaction back when the context of BeginTx
	// ends; this one must outlive ctx once it holds the lock (InLock), so
	// only its statements follow ctx.
	txCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	g := r.db.Session(&gorm.Session{NewDB: true, Context: txCtx}).Begin()
	if g.Error != nil {
		cancel()
		return nil, storeError(ctx, op, g.Error)
	}
	tx := &lockTx{plain: &plainTx{tx: g, cancel: cancel}}
	held, found, err := tx.plain.lock(ctx, r, connection, mode)
	if err == nil && found && held != heldNone {
		tx.held = held
		var rows []tokenRow
		err = g.WithContext(ctx).Raw(selectToken+" WHERE c.name = ?", connection).Find(&rows).Error
		if len(rows) > 0 {
			tx.first = &rows[0]
		}
	}
	if err != nil || !found || held == heldNone {
		tx.rollback(ctx)
	}
	switch {
	case err != nil:
		return nil, storeError(ctx, op, err)
	case !found:
		return nil, fmt.Errorf("%s: %w", op, domain.ErrNotFound)
	case held == heldNone:
		return nil, nil
	}
	return tx, nil
}

// lock sets the lock timeout and takes the lock as mode says.
func (p *plainTx) lock(ctx context.Context, r *TokenRepository, name string, mode lockMode) (held int, found bool, err error) {
	q := p.tx.WithContext(ctx)
	if !mode.try && mode.wait > 0 {
		if err := q.Exec("SELECT set_config('lock_timeout', ?, true)", fmt.Sprintf("%dms", max(mode.wait.Milliseconds(), 1))).Error; err != nil {
			return heldNone, false, err
		}
	}
	if !mode.try && !mode.share {
		err := r.WithAdvisoryLock(q, name)
		if errors.Is(err, domain.ErrNotFound) {
			return heldNone, false, nil
		}
		return heldExclusive, err == nil, err
	}
	stmt := lockOrAwaitByNameSQL
	if mode.try {
		stmt = tryLockByNameSQL
	}
	var rows []int
	if err := q.Raw(stmt, lockNamespace, name).Find(&rows).Error; err != nil {
		return heldNone, false, err
	}
	if len(rows) == 0 {
		return heldNone, false, nil
	}
	return rows[0], true, nil
}

// writeAndCommit is lockTx.writeAndCommit in two round trips.
func (p *plainTx) writeAndCommit(ctx context.Context, ended *bool, sql string, args ...any) (*tokenRow, error) {
	var rows []tokenRow
	if err := p.tx.WithContext(ctx).Raw(sql, args...).Find(&rows).Error; err != nil {
		p.aborted = true
		return nil, err // end rolls back
	}
	*ended = true
	if err := p.end(true); err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, nil
	}
	return &rows[0], nil
}

// end commits or rolls back.
func (p *plainTx) end(commit bool) error {
	defer p.cancel()
	if !commit || p.aborted {
		err := p.tx.Rollback().Error
		if commit {
			return errCommitRolledBack
		}
		return err
	}
	return p.tx.Commit().Error
}
