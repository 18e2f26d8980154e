// Package migrations holds the database schema as versioned SQL files,
// embedded in the binary, and applies them with golang-migrate.
//
// tokenguard records its schema version in a table of its own, Table, so
// that it never touches the version of an application that shares the
// database and uses golang-migrate's default schema_migrations itself.
package migrations

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"

	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/database"
	pgxmigrate "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
)

//go:embed *.sql
var files embed.FS

// Table is where tokenguard's schema version is recorded.
const Table = "tokenguard_schema_migrations"

// legacyTable is where deployments recorded it before Table existed:
// golang-migrate's default, which applications use too.
const legacyTable = "schema_migrations"

// Up applies every pending migration to the database at url.
func Up(url string) error {
	return withPool(url, func(db *sql.DB) error { return UpDB(context.Background(), db) })
}

// UpDB applies every pending migration on a connection of db, which it
// gives back; db stays open. It works with any database/sql Postgres
// driver.
//
// Processes that migrate at once wait for each other: golang-migrate takes
// a session advisory lock keyed by Table (in the single-int8 key space,
// apart from the connection locks), and UpDB first takes the one
// golang-migrate takes for the legacy schema_migrations, so that it also
// waits for an older process migrating with that table (a rolling deploy).
//
// The first time, on a database whose tables an older version created and
// recorded in schema_migrations, it adopts that version (see adopt).
func UpDB(ctx context.Context, db *sql.DB) error {
	return withMigrate(ctx, db, func(m *migrate.Migrate) error {
		if err := m.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
			return err
		}
		return nil
	})
}

// Down reverts every migration. Tests use it; operators rarely should.
func Down(url string) error {
	return withPool(url, func(db *sql.DB) error {
		return withMigrate(context.Background(), db, func(m *migrate.Migrate) error {
			if err := m.Down(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
				return err
			}
			return nil
		})
	})
}

// Version reports the schema version the database is at (0 when none).
func Version(url string) (version uint, dirty bool, err error) {
	err = withPool(url, func(db *sql.DB) error {
		return withMigrate(context.Background(), db, func(m *migrate.Migrate) error {
			version, dirty, err = m.Version()
			if errors.Is(err, migrate.ErrNilVersion) {
				return nil
			}
			return err
		})
	})
	return version, dirty, err
}

func withPool(url string, fn func(*sql.DB) error) error {
	db, err := sql.Open("pgx", url)
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	defer db.Close()
	return fn(db)
}

// withMigrate runs fn on one connection of db holding the legacy lock, with
// the version adopted if need be.
func withMigrate(ctx context.Context, db *sql.DB, fn func(*migrate.Migrate) error) (err error) {
	src, err := iofs.New(files, ".")
	if err != nil {
		return fmt.Errorf("migrations: source: %w", err)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("migrations: connect: %w", err)
	}
	unlock, err := lockLegacy(ctx, conn)
	if err != nil {
		_ = conn.Close()
		return fmt.Errorf("migrations: %w", err)
	}
	defer func() {
		if unlock() != nil {
			// A session lock must not go back to the pool with its
			// connection: close that connection instead.
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
		_ = conn.Close()
	}()
	if err := adopt(ctx, conn, src); err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	// The driver runs on conn alone and closes only heldDB's wrapper of it;
	// the deferred Close gives conn back.
	drv, err := pgxmigrate.WithInstance(heldDB(conn), &pgxmigrate.Config{MigrationsTable: Table})
	if err != nil {
		return fmt.Errorf("migrations: connect: %w", err)
	}
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", drv)
	if err != nil {
		_ = drv.Close()
		return fmt.Errorf("migrations: %w", err)
	}
	defer m.Close()
	if err := fn(m); err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	return nil
}

// lockLegacy takes the session advisory lock golang-migrate takes for
// schema_migrations in the current database and schema, and returns its
// release.
func lockLegacy(ctx context.Context, conn *sql.Conn) (unlock func() error, err error) {
	var dbName, schema string
	if err := conn.QueryRowContext(ctx, "SELECT current_database(), current_schema()").Scan(&dbName, &schema); err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	id, err := database.GenerateAdvisoryLockId(dbName, schema, legacyTable)
	if err != nil {
		return nil, err
	}
	if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock($1)", id); err != nil {
		return nil, fmt.Errorf("wait for other migrations: %w", err)
	}
	return func() error {
		_, err := conn.ExecContext(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", id)
		return err
	}, nil
}

// adopt records in Table the version an older tokenguard recorded in
// schema_migrations, when Table does not exist yet and tokenguard's tables
// do. It leaves schema_migrations as it is, for the older processes still
// running. A version in schema_migrations that is not one of tokenguard's
// (the application's own, say) is refused with what to do instead.
func adopt(ctx context.Context, conn *sql.Conn, src source.Driver) error {
	var ours, ourTables, legacy bool
	err := conn.QueryRowContext(ctx, `SELECT
		to_regclass(quote_ident(current_schema()) || '.' || quote_ident($1)) IS NOT NULL,
		to_regclass(quote_ident(current_schema()) || '.connections') IS NOT NULL
			AND to_regclass(quote_ident(current_schema()) || '.tokens') IS NOT NULL,
		to_regclass(quote_ident(current_schema()) || '.' || quote_ident($2)) IS NOT NULL`,
		Table, legacyTable).Scan(&ours, &ourTables, &legacy)
	if err != nil {
		return fmt.Errorf("read the schema: %w", err)
	}
	if ours || !ourTables {
		return nil // adopted already, or a database tokenguard never used
	}
	howTo := fmt.Sprintf("if they are at version N, record it with CREATE TABLE %[1]s (version bigint NOT NULL PRIMARY KEY, dirty boolean NOT NULL); INSERT INTO %[1]s VALUES (N, false)", Table)
	if !legacy {
		return fmt.Errorf("tokenguard's tables exist but no schema version is recorded for them; %s", howTo)
	}
	var version int64
	var dirty bool
	err = conn.QueryRowContext(ctx, "SELECT version, dirty FROM "+legacyTable+" LIMIT 1").Scan(&version, &dirty)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("tokenguard's tables exist but %s is empty; %s", legacyTable, howTo)
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", legacyTable, err)
	}
	if dirty {
		return fmt.Errorf("%s says version %d is dirty (a migration failed half-way): repair it before upgrading", legacyTable, version)
	}
	if version < 1 || !known(src, uint(version)) {
		return fmt.Errorf("tokenguard's tables exist and %s holds version %d, which is not one of tokenguard's (the application's own?); %s", legacyTable, version, howTo)
	}
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, "CREATE TABLE "+Table+" (version bigint NOT NULL PRIMARY KEY, dirty boolean NOT NULL)"); err != nil {
		return fmt.Errorf("create %s: %w", Table, err)
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO "+Table+" (version, dirty) VALUES ($1, false)", version); err != nil {
		return fmt.Errorf("record version %d in %s: %w", version, Table, err)
	}
	return tx.Commit()
}

// known reports whether v is the version of one of the embedded migrations.
func known(src source.Driver, v uint) bool {
	r, _, err := src.ReadUp(v)
	if err != nil {
		return false
	}
	_ = r.Close()
	return true
}
