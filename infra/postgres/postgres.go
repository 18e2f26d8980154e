// Package postgres opens the GORM connection pool tokenguard runs on.
package postgres

import (
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// Pool sizes the connection pool. A refresh holds a connection only for its
// short transactions, never across a provider call, so a small pool serves many.
type Pool struct {
	MaxOpenConns int // 0: 10
}

// Open connects to the database at url and checks it answers. GORM logs
// through log (repository.NewLogger keeps tokens out); nil logs nothing.
func Open(ctx context.Context, url string, pool Pool, log logger.Interface) (*gorm.DB, error) {
	// No default transaction: each write is in a transaction already.
	db, err := gorm.Open(postgres.New(postgres.Config{
		DSN:          url,
		OptionOpenDB: []stdlib.OptionOpenDB{stdlib.OptionShouldPing(shouldPing)},
	}), &gorm.Config{Logger: cmp.Or(log, logger.Discard), SkipDefaultTransaction: true})
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	maxOpen := cmp.Or(pool.MaxOpenConns, 10)
	sqlDB.SetMaxOpenConns(maxOpen)
	// As many idle: fewer would close and reopen a connection (a new backend) per use above that many at once.
	sqlDB.SetMaxIdleConns(maxOpen)
	sqlDB.SetConnMaxLifetime(30 * time.Minute)
	sqlDB.SetConnMaxIdleTime(5 * time.Minute)
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := sqlDB.PingContext(pingCtx); err != nil {
		_ = sqlDB.Close()
		return nil, fmt.Errorf("connect to database: %w", err)
	}
	return db, nil
}

// Close closes the pool behind db.
func Close(db *gorm.DB) error {
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	return sqlDB.Close()
}

// shouldPing pings an idle connection before reuse only if its socket holds something (a server
// that drops a connection leaves its last error and the end of the stream there), has ended, or
// cannot be looked at: a refresh's first statement then costs one round trip, not two.
func shouldPing(_ context.Context, p stdlib.ShouldPingParams) bool {
	if p.IdleDuration <= time.Second {
		return false // pgx's own rule: recently used, taken as alive
	}
	c := p.Conn.PgConn().Conn()
	if t, ok := c.(*tls.Conn); ok {
		c = t.NetConn() // a close_notify or an error is a record in the socket too
	}
	return !quiet(c)
}
