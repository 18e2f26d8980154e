// Package migrations holds the database schema as versioned SQL files,
// embedded in the binary, and applies them with golang-migrate.
//
// Every object tokenguard creates is named tokenguard_* (tables,
// sequences, indexes, triggers, functions, NOTIFY channels), its schema
// version included (Table), so that it never meets the tables or the
// golang-migrate schema_migrations of an application sharing the schema.
package migrations

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"io"

	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/database"
	pgxmigrate "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver

	"github.com/tokenguard/tokenguard/domain"
)

//go:embed *.sql
var files embed.FS

// Table is where tokenguard's schema version is recorded.
const Table = "tokenguard_schema_migrations"

// legacyTable is where deployments recorded it before Table existed:
// golang-migrate's default, which applications use too.
const legacyTable = "schema_migrations"

// prefixVersion is the migration that gives an earlier release's tables
// their tokenguard_ names (and views under the old ones); the migrations
// before it, as this release has them, name the new names.
const prefixVersion = 12

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
// recorded in schema_migrations, it adopts that version (see adopt). A
// search_path naming a schema that does not exist is
// domain.ErrSchemaNotFound (CheckSearchPath).
//
// A database a later release migrated (a version this one does not have,
// above its last) is left as it is: migrations are additive, so this
// release works on it, and one of its processes restarting during the
// later release's rolling deploy still starts.
func UpDB(ctx context.Context, db *sql.DB) error {
	return withMigrate(ctx, db, func(m *migrate.Migrate) error {
		if v, dirty, err := m.Version(); err == nil && !dirty && v > last() {
			return nil
		}
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
	if err := CheckSearchPath(ctx, conn); err != nil {
		_ = conn.Close()
		return fmt.Errorf("migrations: %w", err)
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
	if err := prefixEarly(ctx, conn, src); err != nil {
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
	// Those releases named their tables connections and tokens; an
	// application's tables of those names lack tokens' own columns.
	err := conn.QueryRowContext(ctx, `SELECT
		to_regclass(quote_ident(current_schema()) || '.' || quote_ident($1)) IS NOT NULL,
		to_regclass(quote_ident(current_schema()) || '.tokenguard_tokens') IS NOT NULL
			OR to_regclass(quote_ident(current_schema()) || '.connections') IS NOT NULL
			AND (SELECT count(*) = 3 FROM pg_attribute
			     WHERE attrelid = to_regclass(quote_ident(current_schema()) || '.tokens')
			       AND attname IN ('connection_id', 'refresh_token', 'obtained_at') AND NOT attisdropped),
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

// prefixEarly renames an earlier release's tables (migration
// prefixVersion) before the migrations below it run, on a database that
// release left below prefixVersion-1: as this release has them, those
// migrations name the tokenguard_ tables. The migration is a no-op once
// the tables have their names, when golang-migrate reaches it.
func prefixEarly(ctx context.Context, conn *sql.Conn, src source.Driver) error {
	var recorded bool
	err := conn.QueryRowContext(ctx, "SELECT to_regclass(quote_ident(current_schema()) || '.' || quote_ident($1)) IS NOT NULL", Table).Scan(&recorded)
	if err != nil || !recorded {
		return err // a new database, created with the new names
	}
	var version sql.NullInt64
	var dirty bool
	err = conn.QueryRowContext(ctx, "SELECT version, dirty FROM "+Table+" LIMIT 1").Scan(&version, &dirty)
	if errors.Is(err, sql.ErrNoRows) {
		return nil // at no version yet
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", Table, err)
	}
	if dirty || version.Int64 < 1 || version.Int64 >= prefixVersion-1 {
		return nil // golang-migrate refuses a dirty version; at 11 or above the migration itself runs
	}
	r, _, err := src.ReadUp(prefixVersion)
	if err != nil {
		return fmt.Errorf("read migration %d: %w", prefixVersion, err)
	}
	defer r.Close()
	body, err := io.ReadAll(r)
	if err != nil {
		return fmt.Errorf("read migration %d: %w", prefixVersion, err)
	}
	if _, err := conn.ExecContext(ctx, string(body)); err != nil {
		return fmt.Errorf("rename the tables of version %d (migration %d): %w", version.Int64, prefixVersion, err)
	}
	return nil
}

// CheckSearchPath fails with domain.ErrSchemaNotFound, naming the schema,
// when q's search_path names a schema that does not exist or that the
// role may not use ("$user" and pg_temp aside, which Postgres skips by
// design), or none at all: Postgres would put the tables in the next
// schema of the path, or nowhere.
func CheckSearchPath(ctx context.Context, q interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}) error {
	var path string
	var current, missing sql.NullString
	err := q.QueryRowContext(ctx, `SELECT current_setting('search_path'), current_schema(),
		(SELECT n FROM unnest(string_to_array(current_setting('search_path'), ',')) WITH ORDINALITY AS p(e, i),
		     LATERAL (SELECT (parse_ident(btrim(e), false))[1] AS n) id
		 WHERE btrim(e) NOT IN ('', '"$user"', '$user', 'pg_temp', '"pg_temp"')
		   AND NOT EXISTS (SELECT FROM pg_namespace WHERE nspname = n AND has_schema_privilege(oid, 'USAGE'))
		 ORDER BY i LIMIT 1)`).Scan(&path, &current, &missing)
	if err != nil {
		return fmt.Errorf("%w: read the search_path: %w", domain.ErrStoreUnavailable, err)
	}
	switch {
	case missing.Valid:
		return fmt.Errorf("%w: schema %q (search_path %s) does not exist or this role may not use it: create it (CREATE SCHEMA %s) or name another",
			domain.ErrSchemaNotFound, missing.String, path, pgx.Identifier{missing.String}.Sanitize())
	case !current.Valid:
		return fmt.Errorf("%w: search_path %q names no schema that exists", domain.ErrSchemaNotFound, path)
	}
	return nil
}

// last is the version of the last embedded migration.
func last() uint {
	entries, _ := files.ReadDir(".")
	var v uint
	for _, e := range entries {
		if m, err := source.DefaultParse(e.Name()); err == nil {
			v = max(v, m.Version)
		}
	}
	return v
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
