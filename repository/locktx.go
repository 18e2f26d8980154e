package repository

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
)

// lockTx is the transaction of InLock and TryInLock. It commits on its
// own (a rotated token must not depend on a caller's commit), so it cannot
// nest in another transaction.
//
// On pgx (the driver of gorm.io/driver/postgres) it is one pool connection
// of its own, on which the transaction is driven explicitly with pgx (GORM
// cannot pipeline). It opens with one round trip: BEGIN, the lock timeout,
// the lock and the re-read of the token go to the server together as a
// pipeline. Before a refresh can start that saves three round trips.
// Statements of a pipeline run one
// after the other and each takes its own snapshot (READ COMMITTED), so the
// read sees everything committed before the lock was granted. A write (a
// lease, a token) ends it the same way: the statement and COMMIT in one
// round trip (execAndCommit).
//
// On any other database/sql driver it is a GORM transaction running the
// same statements one at a time (plaintx.go): same contract, more round
// trips.
type lockTx struct {
	conn  *sql.Conn // pgx
	plain *plainTx  // any other driver
	held  bool      // the lock was taken (TryInLock may find it taken)
	first *tokenRow // the re-read, if the connection has a token
	// leased: another holder's lease on the version read runs on this
	// server; Lease of that version then refuses without a write.
	leased bool
	ended  bool
	// bid, if the transaction was opened with one, is its lease bid: it
	// took the lease or not, and committed, in the lock's round trip.
	bid *leaseBid
}

// leaseBid is a lease asked for with the lock (ClaimInLock).
type leaseBid struct {
	version int64
	call    time.Duration
	holder  string
	won     bool // the lease on version is holder's
	other   bool // another holder's lease on version runs
	handed  bool // Lease handed it out
}

// lockMode says how beginLocked takes the lock.
type lockMode struct {
	try  bool          // take it only if nobody holds it
	wait time.Duration // the bound of a wait (lock_timeout); 0: none
	bid  *leaseBid     // with try: take this lease too, and commit (pgx only)
}

// errNotPgx: the pool's driver is not pgx; the GORM path is taken.
var errNotPgx = errors.New("database driver is not pgx")

// beginLocked acquires a pool connection, begins a transaction and takes
// connection's lock. ctx bounds all of it. It returns a nil lockTx and no
// error when mode.try found the lock taken.
func (r *TokenRepository) beginLocked(ctx context.Context, connection string, mode lockMode) (*lockTx, error) {
	pool, ok := r.db.Statement.ConnPool.(interface {
		Conn(context.Context) (*sql.Conn, error)
	})
	if !ok {
		return nil, fmt.Errorf("lock connection %s: the token repository is bound to %T, not to a connection pool", connection, r.db.Statement.ConnPool)
	}
	if r.notPgx.Load() {
		return r.beginPlain(ctx, connection, mode)
	}
	conn, err := pool.Conn(ctx)
	if err != nil {
		return nil, storeError(ctx, "lock connection "+connection, err)
	}
	tx := &lockTx{conn: conn, bid: mode.bid}
	var found bool
	err = conn.Raw(func(dc any) error {
		pc, err := pgxConn(dc)
		if err != nil {
			return errNotPgx
		}
		found, err = pipelineLock(ctx, pc, connection, mode, r.syncCommit(), tx)
		return err
	})
	if errors.Is(err, errNotPgx) {
		_ = conn.Close() // unused: back to the pool
		r.notPgx.Store(true)
		return r.beginPlain(ctx, connection, mode)
	}
	if err == nil && tx.bid != nil {
		// The bid's pipeline committed: the lock and the connection are
		// let go; fn reads what it found.
		tx.ended = true
		_ = conn.Close()
	}
	if err != nil || !found || !tx.held {
		tx.rollback(ctx)
	}
	switch {
	case err != nil:
		return nil, storeError(ctx, "lock connection "+connection, err)
	case !found:
		return nil, fmt.Errorf("lock connection %s: %w", connection, domain.ErrNotFound)
	case !tx.held:
		return nil, nil
	}
	return tx, nil
}

// Pipelined reports whether the lock transactions run pipelined on pgx
// (true) or as GORM transactions on another driver (false). It asks the
// pool for a connection to find out.
func (r *TokenRepository) Pipelined(ctx context.Context) (bool, error) {
	pool, ok := r.db.Statement.ConnPool.(interface {
		Conn(context.Context) (*sql.Conn, error)
	})
	if !ok {
		return false, fmt.Errorf("the token repository is bound to %T, not to a connection pool", r.db.Statement.ConnPool)
	}
	conn, err := pool.Conn(ctx)
	if err != nil {
		return false, storeError(ctx, "connect", err)
	}
	defer conn.Close()
	var pgx bool
	err = conn.Raw(func(dc any) error {
		_, err := pgxConn(dc)
		pgx = err == nil
		return nil
	})
	return pgx, err
}

// pipelineLock sends the opening statements of tx in one batch and reads
// their answers into it. With a bid, the lease statement and COMMIT follow
// in the same batch: the lease is taken only under the lock (the lock
// statement records in the transaction whether it was granted), so the
// whole claim of a refresh is one round trip.
func pipelineLock(ctx context.Context, c *pgx.Conn, name string, mode lockMode, syncCommit string, tx *lockTx) (found bool, err error) {
	var b pgx.Batch
	var wait time.Duration
	if !mode.try {
		wait = mode.wait
	}
	beginLockTx(&b, syncCommit, wait)
	lockSQL := lockByNameSQL
	switch {
	case mode.bid != nil:
		lockSQL = tryLockForBidSQL
	case mode.try:
		lockSQL = tryLockByNameSQL
	}
	b.Queue(lockSQL, lockNamespace, name).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			found = true
			if err := rows.Scan(&tx.held); err != nil {
				return err
			}
		}
		return rows.Err()
	})
	b.Queue(selectToken+" WHERE c.name = $1", name).Query(func(rows pgx.Rows) error {
		var err error
		tx.first, err = scanTokenRow(rows)
		return err
	})
	b.Queue(leasedSQL, name).QueryRow(func(row pgx.Row) error { return row.Scan(&tx.leased) })
	var tag pgconn.CommandTag
	if bid := mode.bid; bid != nil {
		var got []string
		b.Queue(bidLeaseSQL, name, bid.version, bid.holder, (max(bid.call, 0) + leaseTerm).Milliseconds(), restartGrace.Milliseconds(),
			string(domain.StatusNeedsReauth)).Query(func(rows pgx.Rows) error { return scanStrings(&got)(rows) })
		b.Queue("COMMIT").Exec(func(ct pgconn.CommandTag) error { tag = ct; return nil })
		defer func() {
			if err == nil {
				bid.won = len(got) == 1 && got[0] == bid.holder
				bid.other = len(got) == 1 && !bid.won
			}
		}()
	}
	if err := c.SendBatch(ctx, &b).Close(); err != nil {
		return false, err
	}
	if mode.bid != nil && tag.String() != "COMMIT" {
		return false, errCommitRolledBack
	}
	if !tx.held {
		tx.first, tx.leased = nil, false // read without the lock: worth nothing
	}
	return found, nil
}

// gorm binds a GORM session to the transaction's connection.
func (tx *lockTx) gorm(db *gorm.DB, ctx context.Context) *gorm.DB {
	if tx.plain != nil {
		return tx.plain.tx.WithContext(ctx)
	}
	g := db.Session(&gorm.Session{NewDB: true, Context: ctx}) // Context: a statement of its own
	g.Statement.ConnPool = tx.conn
	return g
}

// end commits or rolls back and gives the connection back to the pool. A
// connection whose transaction did not end cleanly (the database went
// away, the commit failed, the transaction was aborted) is closed rather
// than pooled: it might still hold the lock. It returns the error of the
// COMMIT or ROLLBACK.
func (tx *lockTx) end(ctx context.Context, commit bool) error {
	if tx.ended {
		return nil
	}
	tx.ended = true
	if tx.plain != nil {
		return tx.plain.end(commit)
	}
	stmt := "ROLLBACK"
	if commit {
		stmt = "COMMIT"
	}
	var err error
	_ = tx.conn.Raw(func(dc any) error {
		var pc *pgx.Conn
		if pc, err = pgxConn(dc); err != nil {
			return driver.ErrBadConn
		}
		var tag pgconn.CommandTag
		tag, err = pc.Exec(ctx, stmt)
		if err == nil && commit && tag.String() != "COMMIT" {
			// Postgres answers COMMIT of an aborted transaction with ROLLBACK.
			err = errCommitRolledBack
		}
		if err != nil || pc.PgConn().TxStatus() != 'I' {
			return driver.ErrBadConn // closes it
		}
		return nil
	})
	_ = tx.conn.Close()
	return err
}

// rollback ends the transaction, bounded by rollbackTimeout rather than
// by ctx: the connection goes back to the pool even when the caller gave
// up.
func (tx *lockTx) rollback(ctx context.Context) {
	endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	_ = tx.end(endCtx, false)
}

// writeAndCommit runs a write that returns at most one tokenRow and
// commits, in one round trip. It returns a nil row if nothing was written.
// If the write fails, the transaction is left to be rolled back.
func (tx *lockTx) writeAndCommit(ctx context.Context, sql string, args ...any) (row *tokenRow, err error) {
	if tx.plain != nil {
		if tx.ended {
			return nil, errTxEnded
		}
		return tx.plain.writeAndCommit(ctx, &tx.ended, sql, args...)
	}
	err = tx.execAndCommit(ctx, func(rows rowScanner) error {
		var err error
		row, err = scanTokenRow(rows)
		return err
	}, sql, args...)
	return row, err
}

// execAndCommit runs a statement, hands its rows to scan, and commits, in
// one round trip. If the statement fails, the transaction is left to be
// rolled back.
func (tx *lockTx) execAndCommit(ctx context.Context, scan func(rowScanner) error, sql string, args ...any) (err error) {
	if tx.ended {
		return errTxEnded
	}
	if tx.plain != nil {
		return tx.plain.execAndCommit(ctx, &tx.ended, scan, sql, args...)
	}
	_ = tx.conn.Raw(func(dc any) error {
		var pc *pgx.Conn
		if pc, err = pgxConn(dc); err != nil {
			return nil
		}
		var b pgx.Batch
		b.Queue(sql, args...).Query(func(rows pgx.Rows) error { return scan(rows) })
		var tag pgconn.CommandTag
		b.Queue("COMMIT").Exec(func(ct pgconn.CommandTag) error { tag = ct; return nil })
		err = pc.SendBatch(ctx, &b).Close()
		if err == nil && tag.String() != "COMMIT" {
			// Postgres answers COMMIT of an aborted transaction with ROLLBACK.
			err = errCommitRolledBack
		}
		return nil
	})
	if err != nil {
		return err // end rolls back, or closes a broken connection
	}
	tx.ended = true
	_ = tx.conn.Close()
	return nil
}

// pgxConn is the pgx connection under a database/sql driver connection
// (conn.Raw's argument).
func pgxConn(dc any) (*pgx.Conn, error) {
	pc, ok := dc.(interface{ Conn() *pgx.Conn })
	if !ok {
		return nil, fmt.Errorf("database driver %T is not pgx", dc)
	}
	return pc.Conn(), nil
}

// rowScanner is what pgx.Rows and *sql.Rows have in common.
type rowScanner interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// scanTokenRow reads the one row of a selectToken or tokenColumns query,
// if there is one.
func scanTokenRow(rows rowScanner) (*tokenRow, error) {
	var row *tokenRow
	for rows.Next() {
		var t tokenRow
		if err := rows.Scan(&t.LockKey, &t.Name, &t.AccessToken, &t.TokenType, &t.RefreshToken,
			&t.Expiry, &t.RefreshExpiry, &t.ObtainedAt, &t.Version, &t.Status, &t.StatusReason, &t.UpdatedAt,
			&t.GrantedAccount, &t.GrantedScopes, &t.MissingScopes,
			&t.Provider, &t.SealedVersion,
			&t.Failures, &t.FailureSince, &t.FailureLast, &t.RetryAt, &t.ReplayUntil, &t.FailureStatus, &t.FailureCode, &t.Failing); err != nil {
			return nil, err
		}
		row = &t
	}
	return row, rows.Err()
}

// discard closes the connection without ending the transaction; the
// server rolls it back and releases the lock. For the paths that cannot
// trust the connection any more (a panic in the callback).
func (tx *lockTx) discard() {
	if tx.ended {
		return
	}
	tx.ended = true
	if tx.plain != nil {
		_ = tx.plain.end(false) // statements are synchronous: none is mid-way
		return
	}
	_ = tx.conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = tx.conn.Close()
}

// beginLockTx queues the opening of a lock transaction: BEGIN and its
// settings, in one statement whatever they are. synchronous_commit is set
// if syncCommit is not empty, lock_timeout if wait is not 0.
//
// Its statements are planned generically from their first run on a
// connection: a custom plan would be made at each of a connection's first
// five runs of each (0.2-0.5 ms for the token write, more on a busy
// server), and a pool's connections are new after every restart, failover
// or lifetime's end. They read and write single rows by key, so a
// generic plan is the one a custom plan would be.
func beginLockTx(b *pgx.Batch, syncCommit string, wait time.Duration) {
	timeout := ""
	if wait > 0 {
		timeout = fmt.Sprintf("%dms", max(wait.Milliseconds(), 1))
	}
	b.Queue("BEGIN")
	b.Queue(lockTxSettingsSQL, syncCommit, timeout)
}

// lockTxSettingsSQL sets a lock transaction's settings (beginLockTx); an
// empty argument leaves its setting as it is.
const lockTxSettingsSQL = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
       CASE WHEN $1::text <> '' THEN set_config('synchronous_commit', $1, true) END,
       CASE WHEN $2::text <> '' THEN set_config('lock_timeout', $2, true) END`

// rollbackTimeout bounds the ROLLBACK of a transaction whose caller has
// gone; past it the connection is closed instead.
const rollbackTimeout = 2 * time.Second

var (
	errCommitRolledBack = errors.New("commit rolled back: the transaction had failed")
	errTxEnded          = errors.New("the locked transaction has ended: its write committed it")
)

// SaveLocked is InLock with nothing in it but a Save of t: on pgx, BEGIN,
// the lock (waiting at most wait), the version-fenced write with its
// announcement, and COMMIT go to the server together, in one round trip.
// It fails with domain.ErrConflict, having written nothing, when the
// stored version is not t.Version.
func (r *TokenRepository) SaveLocked(ctx context.Context, wait time.Duration, t domain.Token) (domain.Token, error) {
	pool, ok := r.db.Statement.ConnPool.(interface {
		Conn(context.Context) (*sql.Conn, error)
	})
	if !ok || r.notPgx.Load() {
		return r.saveInLock(ctx, wait, t)
	}
	id, cached := r.ids.m.Load(t.Connection)
	if !cached || t.RefreshToken.IsZero() {
		// Rare: the id not read yet, or a refresh token to keep (Save
		// reseals it): the GORM path reads them under the lock.
		return r.saveInLock(ctx, wait, t)
	}
	at := saveSeal(id.(int32), t)
	sealedTok, err := sealed(r.sealer, t, at)
	if err != nil {
		return domain.Token{}, err
	}
	conn, err := pool.Conn(ctx)
	if err != nil {
		return domain.Token{}, storeError(ctx, "save token of "+t.Connection, err)
	}
	defer conn.Close()
	var (
		found bool
		row   *tokenRow
		tag   pgconn.CommandTag
	)
	err = conn.Raw(func(dc any) error {
		pc, err := pgxConn(dc)
		if err != nil {
			return errNotPgx
		}
		var b pgx.Batch
		beginLockTx(&b, r.syncCommit(), wait)
		b.Queue(lockByNameSQL, lockNamespace, t.Connection).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				found = true
			}
			return rows.Err()
		})
		b.Queue(saveSQL, saveArgs(sealedTok, at)...).Query(func(rows pgx.Rows) error {
			var err error
			row, err = scanTokenRow(rows)
			return err
		})
		b.Queue("COMMIT").Exec(func(ct pgconn.CommandTag) error { tag = ct; return nil })
		err = pc.SendBatch(ctx, &b).Close()
		if err != nil && pc.PgConn().TxStatus() != 'I' {
			return fmt.Errorf("%w: %w", driver.ErrBadConn, err) // closes it
		}
		return err
	})
	switch {
	case errors.Is(err, errNotPgx):
		r.notPgx.Store(true)
		return r.saveInLock(ctx, wait, t)
	case err != nil:
		return domain.Token{}, storeError(ctx, "save token of "+t.Connection, err)
	case tag.String() != "COMMIT":
		return domain.Token{}, storeError(ctx, "save token of "+t.Connection, errCommitRolledBack)
	case !found:
		return domain.Token{}, fmt.Errorf("save token of %s: %w", t.Connection, domain.ErrNotFound)
	case row == nil:
		r.ids.forget(t.Connection) // or the id changed: read again by the caller's retry
		return domain.Token{}, fmt.Errorf("save token of %s at version %d: %w", t.Connection, t.Version, domain.ErrConflict)
	}
	return row.domain(r.sealer)
}

// saveInLock is SaveLocked on the GORM path.
func (r *TokenRepository) saveInLock(ctx context.Context, wait time.Duration, t domain.Token) (domain.Token, error) {
	var out domain.Token
	hold := rollbackTimeout
	if d, ok := ctx.Deadline(); ok {
		hold = time.Until(d)
	}
	err := r.inLock(ctx, t.Connection, wait, hold, func(ctx context.Context, l *LockedTokens) error {
		var err error
		out, err = l.Save(ctx, t)
		return err
	})
	return out, err
}
