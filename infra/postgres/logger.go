package postgres

import (
	"context"
	"log/slog"
	"regexp"
	"time"

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

func newLogger(log *slog.Logger) logger.Interface {
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
	}, err)
}

// ParamsFilter keeps GORM from handing bound values to the logger at all.
func (l redactingLogger) ParamsFilter(_ context.Context, sql string, _ ...any) (string, []any) {
	return sql, nil
}
