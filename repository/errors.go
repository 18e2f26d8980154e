package repository

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
)

// storeError turns a database error into a domain error. It keeps the SQLSTATE and message but
// drops the detail, which for constraint errors repeats the failing row, tokens included.
func storeError(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return fmt.Errorf("%s: %w", op, domain.ErrNotFound)
	}
	if sqlState(err) == "55P03" { // lock_not_available: lock_timeout fired
		return fmt.Errorf("%s: %w", op, domain.ErrLockTimeout)
	}
	// A context ended surfaces as whatever the driver saw: report the reason. A deadline is also
	// the store's failure to answer in time, which callers tell from their own cancellation.
	switch ctxErr := ctx.Err(); {
	case errors.Is(ctxErr, context.DeadlineExceeded):
		return fmt.Errorf("%s: %w (%w)", op, domain.ErrStoreUnavailable, ctxErr)
	case ctxErr != nil:
		return fmt.Errorf("%s: %w", op, ctxErr)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return fmt.Errorf("%s: %w: %s", op, domain.ErrStoreUnavailable, safeMessage(pgErr))
	}
	return fmt.Errorf("%s: %w: %v", op, domain.ErrStoreUnavailable, err)
}

// sqlState is err's SQLSTATE code, "" for none (pgx and lib/pq alike).
func sqlState(err error) string {
	var coded interface{ SQLState() string }
	if errors.As(err, &coded) {
		return coded.SQLState()
	}
	return ""
}
