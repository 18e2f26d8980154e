package repository

import (
	"context"
	"errors"
	"fmt"
	"strings"

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
	var err error
	if r.syncCommit() != "" {
		err = g.WithContext(ctx).Exec("SELECT set_config('synchronous_commit', ?, true)", r.syncCommit()).Error
	}
	held, found := false, false
	if err == nil {
		held, found, err = tx.plain.lock(ctx, r, connection, mode)
	}
	if err == nil && found && held {
		tx.held = held
		var rows []tokenRow
		err = g.WithContext(ctx).Raw(selectToken+" WHERE c.name = ?", connection).Find(&rows).Error
		if len(rows) > 0 {
			tx.first = &rows[0]
		}
		if err == nil {
			err = g.WithContext(ctx).Raw(strings.ReplaceAll(leasedSQL, "$1", "?"), connection).Scan(&tx.leased).Error
		}
	}
	if err != nil || !found || !held {
		tx.rollback(ctx)
	}
	switch {
	case err != nil:
		return nil, storeError(ctx, op, err)
	case !found:
		return nil, fmt.Errorf("%s: %w", op, domain.ErrNotFound)
	case !held:
		return nil, nil
	}
	return tx, nil
}

// lock sets the lock timeout and takes the lock as mode says.
func (p *plainTx) lock(ctx context.Context, r *TokenRepository, name string, mode lockMode) (held, found bool, err error) {
	q := p.tx.WithContext(ctx)
	if !mode.try && mode.wait > 0 {
		if err := q.Exec("SELECT set_config('lock_timeout', ?, true)", fmt.Sprintf("%dms", max(mode.wait.Milliseconds(), 1))).Error; err != nil {
			return false, false, err
		}
	}
	if !mode.try {
		err := r.WithAdvisoryLock(q, name)
		if errors.Is(err, domain.ErrNotFound) {
			return false, false, nil
		}
		return err == nil, err == nil, err
	}
	var rows []bool
	if err := q.Raw(tryLockByNameSQL, lockNamespace, name).Find(&rows).Error; err != nil {
		return false, false, err
	}
	if len(rows) == 0 {
		return false, false, nil
	}
	return rows[0], true, nil
}

// execAndCommit is lockTx.execAndCommit in two round trips.
func (p *plainTx) execAndCommit(ctx context.Context, ended *bool, scan func(rowScanner) error, sql string, args ...any) error {
	rows, err := p.tx.WithContext(ctx).Raw(sql, args...).Rows()
	if err != nil {
		p.aborted = true
		return err // end rolls back
	}
	err = scan(rows)
	if cerr := rows.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		p.aborted = true
		return err
	}
	*ended = true
	return p.end(true)
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
