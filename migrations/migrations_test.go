package migrations_test

import (
	"context"
	"database/sql"
	"os"
	"strings"
	"testing"

	"github.com/golang-migrate/migrate/v4"
	_ "github.com/golang-migrate/migrate/v4/database/pgx/v5" // the pgx5:// driver
	"github.com/golang-migrate/migrate/v4/source/iofs"

	"github.com/tokenguard/tokenguard/internal/testdb"
	"github.com/tokenguard/tokenguard/migrations"
)

func TestMain(m *testing.M) { testdb.Main(m) }

func tables(t *testing.T, url string) map[string]bool {
	t.Helper()
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.QueryContext(context.Background(),
		"SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		out[name] = true
	}
	return out
}

func TestUpDownUp(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	url := testdb.NewEmpty(t)
	if v, _, err := migrations.Version(url); err != nil || v != 0 {
		t.Fatalf("fresh database at version %d, %v", v, err)
	}
	for round := range 2 {
		if err := migrations.Up(url); err != nil {
			t.Fatalf("round %d up: %v", round, err)
		}
		if err := migrations.Up(url); err != nil { // idempotent: three apps migrate at start-up
			t.Fatalf("round %d second up: %v", round, err)
		}
		got := tables(t, url)
		if !got["tokenguard_tokens"] || !got["tokenguard_connections"] || !got["tokenguard_client_auth_styles"] || !hasColumn(t, url, "tokenguard_tokens", "refresh_expiry") {
			t.Fatalf("round %d: after up, tables = %v", round, got)
		}
		if v, dirty, err := migrations.Version(url); err != nil || v == 0 || dirty {
			t.Fatalf("round %d: version %d dirty %v err %v", round, v, dirty, err)
		}
		if err := migrations.Down(url); err != nil {
			t.Fatalf("round %d down: %v", round, err)
		}
		got = tables(t, url)
		if got["tokenguard_tokens"] || got["tokenguard_connections"] || got["tokenguard_client_auth_styles"] || len(got) != 1 {
			t.Fatalf("round %d: after down, tables = %v", round, got)
		}
	}
}

func hasColumn(t *testing.T, url, table, column string) bool {
	t.Helper()
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	err = db.QueryRowContext(context.Background(), `SELECT count(*) FROM information_schema.columns
WHERE table_schema = current_schema() AND table_name = $1 AND column_name = $2`, table, column).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// 000002 is additive: rows written at version 1 survive it unchanged (the
// new column reads NULL), and going back down to 1 removes only what it
// added.
func TestMigration2IsAdditive(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	url := testdb.NewEmpty(t)
	src, err := iofs.New(os.DirFS("."), ".")
	if err != nil {
		t.Fatal(err)
	}
	m, err := migrate.NewWithSourceInstance("iofs", src, "pgx5://"+strings.TrimPrefix(strings.TrimPrefix(url, "postgres://"), "postgresql://"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Migrate(1); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	_, err = db.ExecContext(ctx, `INSERT INTO tokenguard_connections (name) VALUES ('acme');
INSERT INTO tokenguard_tokens (connection_id, access_token, refresh_token, obtained_at, version) SELECT id, 'a', 'r', now(), 7 FROM tokenguard_connections`)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Migrate(2); err != nil {
		t.Fatal(err)
	}
	var version int
	var null bool
	if err := db.QueryRowContext(ctx, "SELECT version, refresh_expiry IS NULL FROM tokenguard_tokens").Scan(&version, &null); err != nil || version != 7 || !null {
		t.Fatalf("after up: version %d, refresh_expiry NULL %v, err %v", version, null, err)
	}
	if _, err := db.ExecContext(ctx, "UPDATE tokenguard_tokens SET refresh_expiry = now()"); err != nil {
		t.Fatal(err)
	}
	if err := m.Migrate(1); err != nil {
		t.Fatal(err)
	}
	if hasColumn(t, url, "tokenguard_tokens", "refresh_expiry") || tables(t, url)["tokenguard_client_auth_styles"] {
		t.Error("down to 1 left what 000002 added")
	}
	if err := db.QueryRowContext(ctx, "SELECT version FROM tokenguard_tokens").Scan(&version); err != nil || version != 7 {
		t.Errorf("after down: version %d, err %v", version, err)
	}
}

func TestConcurrentUp(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	url := testdb.NewEmpty(t)
	errs := make(chan error, 3)
	for range 3 {
		go func() { errs <- migrations.Up(url) }()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Errorf("concurrent up: %v", err)
		}
	}
}

func TestSchemaConstraints(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	db, err := sql.Open("pgx", testdb.New(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "INSERT INTO tokenguard_connections (name) VALUES ('acme')"); err != nil {
		t.Fatal(err)
	}
	bad := map[string]string{
		"bad name":             "INSERT INTO tokenguard_connections (name) VALUES ('has space')",
		"empty refresh token":  "INSERT INTO tokenguard_tokens (connection_id, access_token, refresh_token, obtained_at, version) SELECT id, 'a', '', now(), 1 FROM tokenguard_connections",
		"empty access token":   "INSERT INTO tokenguard_tokens (connection_id, access_token, refresh_token, obtained_at, version) SELECT id, '', 'r', now(), 1 FROM tokenguard_connections",
		"version 0":            "INSERT INTO tokenguard_tokens (connection_id, access_token, refresh_token, obtained_at, version) SELECT id, 'a', 'r', now(), 0 FROM tokenguard_connections",
		"unknown status":       "INSERT INTO tokenguard_tokens (connection_id, access_token, refresh_token, obtained_at, version, status) SELECT id, 'a', 'r', now(), 1, 'zombie' FROM tokenguard_connections",
		"null refresh token":   "INSERT INTO tokenguard_tokens (connection_id, access_token, refresh_token, obtained_at, version) SELECT id, 'a', NULL, now(), 1 FROM tokenguard_connections",
		"unregistered conn id": "INSERT INTO tokenguard_tokens (connection_id, access_token, refresh_token, obtained_at, version) VALUES (424242, 'a', 'r', now(), 1)",
	}
	for name, stmt := range bad {
		if _, err := db.ExecContext(ctx, stmt); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO tokenguard_tokens (connection_id, access_token, refresh_token, obtained_at, version) SELECT id, 'a', 'r', now(), 1 FROM tokenguard_connections"); err != nil {
		t.Errorf("valid row refused: %v", err)
	}
}

// A database migrated by an older version records tokenguard's version in
// schema_migrations (with the tables of the generic names). The first Up
// adopts it into tokenguard's own table, even with several processes
// starting at once, renames the tables and migrates to the last version,
// and leaves schema_migrations as the older processes still running expect
// it.
func TestUpAdoptsTheVersionOfSchemaMigrations(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	want, _, err := migrations.Version(testdb.New(t))
	if err != nil {
		t.Fatal(err)
	}
	url := testdb.NewEmpty(t)
	migratePrevious(t, url, 8, "schema_migrations")
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	errs := make(chan error, 3)
	for range 3 {
		go func() { errs <- migrations.Up(url) }()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatalf("up on a legacy database: %v", err)
		}
	}
	if v, dirty, err := migrations.Version(url); err != nil || v != want || dirty {
		t.Fatalf("version %d dirty %t err %v, want %d", v, dirty, err, want)
	}
	if got := tables(t, url); !got["tokenguard_providers"] || !got["tokenguard_tokens"] {
		t.Fatalf("tables after the upgrade: %v", got)
	}
	var legacy int64
	if err := db.QueryRowContext(ctx, "SELECT version FROM schema_migrations").Scan(&legacy); err != nil || legacy != 8 {
		t.Fatalf("schema_migrations = %d, %v: want it untouched at 8", legacy, err)
	}
}

// The application's own schema_migrations is never read as ours nor
// written: on a fresh database tokenguard migrates beside it; with our
// tables present and only the application's version there, Up refuses and
// says what to do.
func TestUpLeavesTheApplicationsSchemaMigrationsAlone(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	url := testdb.NewEmpty(t)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `CREATE TABLE schema_migrations (version bigint NOT NULL PRIMARY KEY, dirty boolean NOT NULL);
		INSERT INTO schema_migrations VALUES (20240101120000, false)`); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Up(url); err != nil {
		t.Fatal(err)
	}
	var app int64
	if err := db.QueryRowContext(ctx, "SELECT version FROM schema_migrations").Scan(&app); err != nil || app != 20240101120000 {
		t.Fatalf("the application's version = %d, %v", app, err)
	}
	if _, err := db.ExecContext(ctx, "DROP TABLE "+migrations.Table); err != nil {
		t.Fatal(err)
	}
	err = migrations.Up(url)
	if err == nil || !strings.Contains(err.Error(), "20240101120000") || !strings.Contains(err.Error(), "INSERT INTO "+migrations.Table) {
		t.Fatalf("err = %v, want a refusal naming the version and the fix", err)
	}
}

// A database a later release migrated is left at its version: a process of
// this release restarting during that release's rolling deploy starts.
func TestUpLeavesALaterVersionAlone(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	url := testdb.New(t)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("UPDATE " + migrations.Table + " SET version = 999"); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Up(url); err != nil {
		t.Fatalf("up on a later version: %v", err)
	}
	if v, dirty, err := migrations.Version(url); err != nil || v != 999 || dirty {
		t.Fatalf("version %d dirty %t, %v; want 999 untouched", v, dirty, err)
	}
	// The control: a version below the last that is not one of ours is
	// still refused.
	if _, err := db.Exec("UPDATE " + migrations.Table + " SET version = 3"); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Up(url); err == nil {
		t.Fatal("up on the unknown version 3: no error")
	}
}
