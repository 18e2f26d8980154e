// Package migrations holds the database schema as versioned SQL files,
// embedded in the binary, and applies them with golang-migrate.
package migrations

import (
	"database/sql"
	"embed"
	"errors"
	"fmt"

	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
)

//go:embed *.sql
var files embed.FS

// Up applies every pending migration to the database at url. golang-migrate
// takes a session advisory lock (in the single-int8 key space, apart from
// the connection locks), so the three apps may all call it at start-up.
func Up(url string) error { return run(url, (*migrate.Migrate).Up) }

// Down reverts every migration. Tests use it; operators rarely should.
func Down(url string) error { return run(url, (*migrate.Migrate).Down) }

// Version reports the schema version the database is at (0 when none).
func Version(url string) (version uint, dirty bool, err error) {
	err = withMigrate(url, func(m *migrate.Migrate) error {
		version, dirty, err = m.Version()
		if errors.Is(err, migrate.ErrNilVersion) {
			return nil
		}
		return err
	})
	return version, dirty, err
}

func run(url string, step func(*migrate.Migrate) error) error {
	return withMigrate(url, func(m *migrate.Migrate) error {
		if err := step(m); err != nil && !errors.Is(err, migrate.ErrNoChange) {
			return err
		}
		return nil
	})
}

// withMigrate uses a pool of its own: golang-migrate pins a connection and
// closes the pool it was given when it is done.
func withMigrate(url string, fn func(*migrate.Migrate) error) (err error) {
	db, err := sql.Open("pgx", url)
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	src, err := iofs.New(files, ".")
	if err != nil {
		db.Close()
		return fmt.Errorf("migrations: source: %w", err)
	}
	drv, err := pgx.WithInstance(db, &pgx.Config{})
	if err != nil {
		db.Close()
		return fmt.Errorf("migrations: connect: %w", err)
	}
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", drv)
	if err != nil {
		drv.Close()
		return fmt.Errorf("migrations: %w", err)
	}
	defer func() {
		srcErr, dbErr := m.Close()
		if err == nil {
			err = errors.Join(srcErr, dbErr)
		}
	}()
	if err := fn(m); err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	return nil
}
