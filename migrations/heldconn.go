package migrations

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
)

// heldDB is a *sql.DB whose one connection is conn, a connection the
// caller holds (with its session lock) from whatever database/sql driver
// the application uses. golang-migrate's pgx driver takes a *sql.DB and
// closes it when done; given this one, it runs on the caller's connection
// and closes nothing of the application's pool. That driver, unlike the
// lib/pq one, links no second Postgres driver into the application.
func heldDB(conn *sql.Conn) *sql.DB {
	db := sql.OpenDB(heldConnector{conn})
	db.SetMaxOpenConns(1)
	return db
}

type heldConnector struct{ conn *sql.Conn }

func (c heldConnector) Connect(context.Context) (driver.Conn, error) { return heldConn(c), nil }
func (c heldConnector) Driver() driver.Driver                        { return heldDriver{} }

type heldDriver struct{}

func (heldDriver) Open(string) (driver.Conn, error) {
	return nil, errors.New("migrations: a held connection is opened by its connector only")
}

// heldConn passes every statement to the held connection; transactions
// are BEGIN and COMMIT on it.
type heldConn struct{ conn *sql.Conn }

func (h heldConn) Prepare(string) (driver.Stmt, error) { return nil, driver.ErrSkip }
func (h heldConn) Close() error                        { return nil } // the holder closes it
func (h heldConn) Begin() (driver.Tx, error) {
	return h.BeginTx(context.Background(), driver.TxOptions{})
}

func (h heldConn) BeginTx(ctx context.Context, _ driver.TxOptions) (driver.Tx, error) {
	if _, err := h.conn.ExecContext(ctx, "BEGIN"); err != nil {
		return nil, err
	}
	return heldTx(h), nil
}

func (h heldConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	return h.conn.ExecContext(ctx, query, values(args)...)
}

func (h heldConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	rows, err := h.conn.QueryContext(ctx, query, values(args)...)
	if err != nil {
		return nil, err
	}
	cols, err := rows.Columns()
	if err != nil {
		_ = rows.Close()
		return nil, err
	}
	return heldRows{rows, cols}, nil
}

func values(args []driver.NamedValue) []any {
	out := make([]any, len(args))
	for i, a := range args {
		out[i] = a.Value
	}
	return out
}

type heldTx heldConn

func (t heldTx) Commit() error {
	_, err := t.conn.ExecContext(context.Background(), "COMMIT")
	return err
}

func (t heldTx) Rollback() error {
	_, err := t.conn.ExecContext(context.Background(), "ROLLBACK")
	return err
}

type heldRows struct {
	rows *sql.Rows
	cols []string
}

func (r heldRows) Columns() []string { return r.cols }
func (r heldRows) Close() error      { return r.rows.Close() }

func (r heldRows) Next(dest []driver.Value) error {
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return io.EOF
	}
	vals := make([]any, len(dest))
	ptrs := make([]any, len(dest))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if err := r.rows.Scan(ptrs...); err != nil {
		return err
	}
	for i, v := range vals {
		dest[i] = v
	}
	return nil
}
