package tokenguard

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	gormpostgres "gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// OpenPool returns a *gorm.DB over the application's pgx pool, for Migrate
// and New; Run listens on a connection made from pool's configuration.
//
// Closing pool (after Tokens.Close) closes everything.
func OpenPool(pool *pgxpool.Pool) (*gorm.DB, error) {
	if pool == nil {
		return nil, errors.New("tokenguard: OpenPool: nil *pgxpool.Pool")
	}
	d := &gormpostgres.Dialector{Config: &gormpostgres.Config{Conn: stdlib.OpenDBFromPool(pool)}}
	db, err := gorm.Open(poolDialector{Dialector: d, listen: pool.Config().ConnConfig},
		&gorm.Config{Logger: logger.Discard, SkipDefaultTransaction: true})
	if err != nil {
		return nil, fmt.Errorf("tokenguard: OpenPool: %w", err)
	}
	return db, nil
}

// poolDialector carries the pool's configuration for Run's listening connection.
type poolDialector struct {
	*gormpostgres.Dialector
	listen *pgx.ConnConfig
}

// listenConfig is where Run will listen: WithListenDSN's, OpenPool's or db's
// DSN. Without one New fails, rather than a Run whose error may be discarded.
func listenConfig(db *gorm.DB, dsn string) (*pgx.ConnConfig, error) {
	if d, ok := db.Dialector.(poolDialector); ok && dsn == "" {
		return d.listen, nil
	}
	if d, ok := db.Dialector.(*gormpostgres.Dialector); ok && dsn == "" && d.Config != nil {
		dsn = d.Config.DSN
	}
	if dsn == "" {
		return nil, ErrCannotListen
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		// pgx's message may quote the DSN, password included.
		return nil, fmt.Errorf("%w: the DSN does not parse", ErrCannotListen)
	}
	return cfg, nil
}
