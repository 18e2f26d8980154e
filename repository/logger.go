package repository

import (
	"context"
	"errors"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm/logger"
)

// quoted matches SQL string literals, doubled-quote escapes included.
var quoted = regexp.MustCompile(`'(?:[^']|'')*'`)

// redactingLogger is GORM's slog logger with every string literal blanked.
// ParameterizedQueries alone is not enough: GORM's Scan finisher logs the
// statement through a recorder that inlines the bound values, tokens
// included. Masking literals here closes every such path.
type redactingLogger struct {
	logger.Interface
}

// NewLogger is the GORM logger for a pool the repository runs on: it logs
// through log, at warning level and above, and never a token. Bound values
// are never handed to it, string literals are blanked, and Postgres errors
// lose their detail (which can repeat a row).
func NewLogger(log *slog.Logger) logger.Interface {
	return redactingLogger{logger.NewSlogLogger(log, logger.Config{
		SlowThreshold:             time.Second,
		LogLevel:                  logger.Warn,
		ParameterizedQueries:      true,
		IgnoreRecordNotFoundError: true,
	})}
}

func (l redactingLogger) LogMode(level logger.LogLevel) logger.Interface {
	return redactingLogger{l.Interface.LogMode(level)}
}

func (l redactingLogger) Trace(ctx context.Context, begin time.Time, fc func() (string, int64), err error) {
	l.Interface.Trace(ctx, begin, func() (string, int64) {
		sql, rows := fc()
		return quoted.ReplaceAllString(sql, "'?'"), rows
	}, safeError(err))
}

// ParamsFilter keeps GORM from handing bound values to the logger at all.
func (l redactingLogger) ParamsFilter(_ context.Context, sql string, _ ...any) (string, []any) {
	return sql, nil
}

// safeMessage describes a Postgres error without echoing data: the detail
// (which for constraint errors repeats the failing row) is never included,
// and data exceptions (class 22), whose message quotes the offending input,
// are reduced to their SQLSTATE.
func safeMessage(e *pgconn.PgError) string {
	if strings.HasPrefix(e.Code, "22") {
		return "data exception (SQLSTATE " + e.Code + ")"
	}
	return e.Message + " (SQLSTATE " + e.Code + ")"
}

// safeError is what the logger is allowed to print of a query error.
func safeError(err error) error {
	var pgErr *pgconn.PgError
	if err == nil || !errors.As(err, &pgErr) {
		return err
	}
	return errors.New(safeMessage(pgErr))
}
