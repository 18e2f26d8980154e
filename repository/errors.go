package repository

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/tokenguard/tokenguard/domain"
)

// storeError turns a database error into a domain error. It keeps the SQLSTATE and message but
// drops the detail, which for constraint errors repeats the failing row, tokens included.
func storeError(ctx context.Context, op string, err error) error {
	var pgErr *pgconn.PgError
	switch ctxErr := ctx.Err(); {
	case err == nil:
		return nil
	case errors.Is(err, gorm.ErrRecordNotFound):
		return fmt.Errorf("%s: %w", op, domain.ErrNotFound)
	case sqlState(err) == "55P03": // lock_not_available: lock_timeout fired
		return fmt.Errorf("%s: %w", op, domain.ErrLockTimeout)
	// A context ended surfaces as whatever the driver saw: report the reason. A deadline is also
	// the store's failure to answer in time, which callers tell from their own cancellation.
	case errors.Is(ctxErr, context.DeadlineExceeded):
		return fmt.Errorf("%s: %w (%w)", op, domain.ErrStoreUnavailable, ctxErr)
	case ctxErr != nil:
		return fmt.Errorf("%s: %w", op, ctxErr)
	case errors.As(err, &pgErr):
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

// quoted matches SQL string literals, doubled-quote escapes included.
var quoted = regexp.MustCompile(`'(?:[^']|'')*'`)

// redactingLogger is GORM's slog logger with every string literal blanked: ParameterizedQueries
// alone is not enough, as GORM's Scan logs through a recorder that inlines bound values, tokens included.
type redactingLogger struct {
	logger.Interface
	log *slog.Logger
}

// NewLogger is the GORM logger of the repository's pool: it logs through log, at warning and
// above, and never a token: no bound values, string literals or error detail (which can repeat a row).
func NewLogger(log *slog.Logger) logger.Interface {
	return redactingLogger{logger.NewSlogLogger(log, logger.Config{
		SlowThreshold:             time.Second,
		LogLevel:                  logger.Warn,
		ParameterizedQueries:      true,
		IgnoreRecordNotFoundError: true,
	}), log}
}

func (l redactingLogger) LogMode(level logger.LogLevel) logger.Interface {
	return redactingLogger{l.Interface.LogMode(level), l.log}
}

func (l redactingLogger) Trace(ctx context.Context, begin time.Time, fc func() (string, int64), err error) {
	redacted := func() (string, int64) {
		sql, rows := fc()
		return quoted.ReplaceAllString(sql, "'?'"), rows
	}
	if expected(ctx, err) {
		// The caller returns it as a typed error and decides what it is worth: no ERROR line.
		if l.log.Enabled(ctx, slog.LevelDebug) {
			sql, _ := redacted()
			l.log.LogAttrs(ctx, slog.LevelDebug, "tokenguard: statement ended as expected",
				slog.String("sql", sql), slog.String("err", safeError(err).Error()))
		}
		return
	}
	l.Interface.Trace(ctx, begin, redacted, safeError(err))
}

// expected: tokenguard expects and handles err (context ended, lock or statement timeout, lost race).
func expected(ctx context.Context, err error) bool {
	switch sqlState(err) {
	case "55P03", // lock_not_available: lock_timeout
		"57014", // query_canceled: statement_timeout, a cancel request
		"23505", // unique_violation
		"40001", // serialization_failure
		"40P01": // deadlock_detected
		return true
	}
	return err != nil && (ctx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded))
}

// ParamsFilter keeps GORM from handing bound values to the logger at all.
func (l redactingLogger) ParamsFilter(_ context.Context, sql string, _ ...any) (string, []any) {
	return sql, nil
}

// safeMessage describes a Postgres error without echoing data: never the detail (the failing row),
// and for data exceptions (class 22, quoting the input) only the SQLSTATE.
func safeMessage(e *pgconn.PgError) string {
	if strings.HasPrefix(e.Code, "22") {
		return "data exception (SQLSTATE " + e.Code + ")"
	}
	return e.Message + " (SQLSTATE " + e.Code + ")"
}

// safeError is what the logger is allowed to print of a query error.
func safeError(err error) error {
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		return errors.New(safeMessage(pgErr))
	}
	return err
}
