package migrations_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/internal/release"
	"github.com/tokenguard/tokenguard/internal/testdb"
	"github.com/tokenguard/tokenguard/internal/waitfor"
	"github.com/tokenguard/tokenguard/migrations"
)

// The tables of the previous release, with the version that created each.
var previousTables = map[string]uint{"connections": 1, "tokens": 1, "client_auth_styles": 2, "api_keys": 4,
	"connect_sessions": 4, "webhook_outbox": 4, "refresh_leases": 7, "providers": 8}

// previousMigrations is the migrations directory of the previous release,
// from git.
func previousMigrations(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := release.Extract(release.Previous, dir, "migrations"); err != nil {
		t.Fatalf("the previous release's migrations: %v", err)
	}
	return filepath.Join(dir, "migrations")
}

// migratePrevious migrates url to version with the previous release's
// migrations, recording the version in table.
func migratePrevious(t *testing.T, dbURL string, version uint, table string) {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Scheme = "pgx5"
	q := u.Query()
	q.Set("x-migrations-table", table)
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20") // pgx reads + as itself
	src, err := iofs.New(os.DirFS(previousMigrations(t)), ".")
	if err != nil {
		t.Fatal(err)
	}
	m, err := migrate.NewWithSourceInstance("iofs", src, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Migrate(version); err != nil {
		t.Fatalf("the previous release's migrations to %d: %v", version, err)
	}
}

func open(t *testing.T, dbURL string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func exec(t *testing.T, db *sql.DB, stmt string, args ...any) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), stmt, args...); err != nil {
		t.Fatalf("%s: %v", stmt, err)
	}
}

// schemaOf describes every object in the current schema but the views:
// tables, columns, sequences, indexes, constraints, triggers, functions.
func schemaOf(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), `
SELECT 'relation ' || relname || ' ' || relkind::text FROM pg_class
WHERE relnamespace = quote_ident(current_schema())::regnamespace AND relkind IN ('r', 'S', 'i')
UNION ALL
SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || ' not null ' || a.attnotnull
       || ' identity ' || a.attidentity::text || ' default ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE c.relnamespace = quote_ident(current_schema())::regnamespace AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'index ' || pg_get_indexdef(x.indexrelid) FROM pg_index x JOIN pg_class c ON c.oid = x.indrelid
WHERE c.relnamespace = quote_ident(current_schema())::regnamespace
UNION ALL
SELECT 'constraint ' || conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid) FROM pg_constraint
WHERE connamespace = quote_ident(current_schema())::regnamespace
UNION ALL
SELECT 'trigger ' || pg_get_triggerdef(t.oid) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
WHERE c.relnamespace = quote_ident(current_schema())::regnamespace AND NOT t.tgisinternal
UNION ALL
SELECT 'function ' || proname || ' ' || prosrc FROM pg_proc WHERE pronamespace = quote_ident(current_schema())::regnamespace
UNION ALL
SELECT 'sequence of ' || c.relname || '.' || a.attname || ' ' || pg_get_serial_sequence(quote_ident(c.relname), a.attname)
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
WHERE c.relnamespace = quote_ident(current_schema())::regnamespace AND c.relkind = 'r' AND a.attidentity <> ''
ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// views lists the views in the current schema with their comments.
func views(t *testing.T, db *sql.DB) map[string]string {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), `SELECT relname, coalesce(obj_description(oid, 'pg_class'), '') FROM pg_class
		WHERE relnamespace = quote_ident(current_schema())::regnamespace AND relkind = 'v'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var name, comment string
		if err := rows.Scan(&name, &comment); err != nil {
			t.Fatal(err)
		}
		out[name] = comment
	}
	return out
}

// genericNames are the objects named without the prefix.
func genericNames(schema []string) []string {
	var out []string
	for _, line := range schema {
		f := strings.Fields(line)
		var name string
		switch f[0] {
		case "relation":
			name = f[1]
		case "constraint":
			name = f[2]
		case "trigger":
			name = f[3] // trigger CREATE TRIGGER name
		case "function":
			name = f[1]
		}
		if name != "" && !strings.HasPrefix(name, "tokenguard_") {
			out = append(out, line)
		}
	}
	return out
}

// A new database gets no object without the tokenguard_ prefix.
func TestEveryObjectIsPrefixed(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	db := open(t, testdb.New(t))
	schema := schemaOf(t, db)
	if bad := genericNames(schema); len(bad) > 0 || len(schema) < 50 {
		t.Fatalf("%d objects, these without the prefix:\n%s", len(schema), strings.Join(bad, "\n"))
	}
	if v := views(t, db); len(v) != 0 {
		t.Fatalf("views on a new database: %v", v)
	}
}

// A database the previous release migrated to any of its versions ends,
// after Up, with exactly the objects a new database has, its rows kept,
// and a view under each old name that release had created by then; the
// views go with Down, which then empties the schema as on a new database.
func TestUpgradeFromThePreviousRelease(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	// A new database's objects, in public and in a schema whose name
	// needs quotes.
	wants := map[string][]string{}
	for _, schema := range []string{"", "Tenant-A"} {
		dbURL := inSchema(t, testdb.NewEmpty(t), schema)
		if err := migrations.Up(dbURL); err != nil {
			t.Fatal(err)
		}
		wants[schema] = schemaOf(t, open(t, dbURL))
	}
	for _, c := range []struct {
		from   uint
		schema string
	}{{11, ""}, {8, ""}, {4, ""}, {1, ""}, {11, "Tenant-A"}} {
		from, want := c.from, wants[c.schema]
		t.Run(fmt.Sprintf("From%d%s", from, strings.ReplaceAll(c.schema, "-", "")), func(t *testing.T) {
			dbURL := inSchema(t, testdb.NewEmpty(t), c.schema)
			migratePrevious(t, dbURL, from, migrations.Table)
			db := open(t, dbURL)
			exec(t, db, `INSERT INTO connections (name) VALUES ('acme');
INSERT INTO tokens (connection_id, access_token, refresh_token, obtained_at, version) SELECT id, 'at', 'rt', now(), 7 FROM connections`)
			if err := migrations.Up(dbURL); err != nil {
				t.Fatalf("up from %d: %v", from, err)
			}
			if got := schemaOf(t, db); !slices.Equal(got, want) {
				t.Errorf("upgraded from %d, the schema differs from a new one:\n%s", from, diff(want, got))
			}
			var name, rt string
			var version int
			if err := db.QueryRow(`SELECT c.name, t.refresh_token, t.version FROM tokenguard_tokens t
				JOIN tokenguard_connections c ON c.id = t.connection_id`).Scan(&name, &rt, &version); err != nil || name != "acme" || rt != "rt" || version != 7 {
				t.Errorf("the row after the upgrade: %q %q %d, %v", name, rt, version, err)
			}
			v := views(t, db)
			for table, since := range previousTables {
				comment, ok := v[table]
				if ok != (since <= from) || ok && !strings.HasPrefix(comment, "tokenguard: ") {
					t.Errorf("view %s (table since %d, upgraded from %d): present %t, comment %q", table, since, from, ok, comment)
				}
			}
			if len(v) > len(previousTables) {
				t.Errorf("views: %v", v)
			}
			if err := migrations.Down(dbURL); err != nil {
				t.Fatalf("down: %v", err)
			}
			if got := tables(t, dbURL); len(got) != 1 || !got[migrations.Table] {
				t.Errorf("after down: %v", got)
			}
		})
	}
}

func diff(want, got []string) string {
	var b strings.Builder
	for _, w := range want {
		if !slices.Contains(got, w) {
			b.WriteString("- " + w + "\n")
		}
	}
	for _, g := range got {
		if !slices.Contains(want, g) {
			b.WriteString("+ " + g + "\n")
		}
	}
	return b.String()
}

// The statements the previous release runs work through the views on the
// same rows as this release's on the tables: INSERT ... ON CONFLICT (with
// the tables' defaults, identities and BEFORE triggers), UPDATE ... FROM,
// DELETE ... USING, SELECT ... FOR UPDATE (the rows of the table locked)
// and FOR UPDATE SKIP LOCKED, RETURNING; the tables' triggers fire for
// writes through the views, NOTIFY included.
func TestPreviousStatementsThroughTheViews(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	dbURL := testdb.NewEmpty(t)
	migratePrevious(t, dbURL, 11, migrations.Table)
	if err := migrations.Up(dbURL); err != nil {
		t.Fatal(err)
	}
	db := open(t, dbURL)
	ctx := context.Background()
	listener, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(ctx)
	if _, err := listener.Exec(ctx, "LISTEN tokenguard_provider_changed"); err != nil {
		t.Fatal(err)
	}

	registerAndGrantThroughTheViews(t, db)
	// UPDATE ... FROM ... RETURNING t.* (the dead-grant write).
	var lockKey int64
	var status string
	if err := db.QueryRow(`UPDATE tokens AS t SET status = 'needs_reauth', status_reason = 'invalid_grant' FROM connections c
		WHERE c.id = t.connection_id AND c.name = 'acme' RETURNING c.id, t.status`).Scan(&lockKey, &status); err != nil || status != "needs_reauth" {
		t.Fatalf("update through the view: %q, %v", status, err)
	}
	claimEventsThroughTheView(t, db)
	editProviderThroughTheView(t, db, listener)
	disconnectAndTheRestThroughTheViews(t, db)
}

// registerAndGrantThroughTheViews: registration and grant
// (repository/tokens.go of that release); the upsert's version continues
// above a retired one (BEFORE trigger).
func registerAndGrantThroughTheViews(t *testing.T, db *sql.DB) {
	t.Helper()
	exec(t, db, "INSERT INTO connections (name) VALUES ('acme') ON CONFLICT (name) DO NOTHING")
	exec(t, db, "INSERT INTO connections (name) VALUES ('acme') ON CONFLICT (name) DO NOTHING")
	exec(t, db, "UPDATE tokenguard_connections SET retired_version = 4 WHERE name = 'acme'")
	upsert := `WITH c AS (SELECT id, name FROM connections WHERE name = $1)
INSERT INTO tokens AS t (connection_id, access_token, token_type, refresh_token, obtained_at, version, status, status_reason)
SELECT c.id, $2, 'Bearer', $3, now(), $4, 'active', '' FROM c
ON CONFLICT (connection_id) DO UPDATE SET access_token = EXCLUDED.access_token, refresh_token = EXCLUDED.refresh_token,
    version = EXCLUDED.version, updated_at = now()
    WHERE t.version < EXCLUDED.version
RETURNING t.version`
	var version int64
	if err := db.QueryRow(upsert, "acme", "at1", "rt1", 1).Scan(&version); err != nil || version != 5 {
		t.Fatalf("insert through the view: version %d, %v; want 5 (continued above the retired 4)", version, err)
	}
	if err := db.QueryRow(upsert, "acme", "at2", "rt2", 6).Scan(&version); err != nil || version != 6 {
		t.Fatalf("upsert through the view: version %d, %v", version, err)
	}
	if err := db.QueryRow(upsert, "acme", "stale", "stale", 3).Scan(&version); !errors.Is(err, sql.ErrNoRows) {
		t.Fatalf("an older version through the view: %d, %v; want no row", version, err)
	}
	var rt string
	if err := db.QueryRow("SELECT refresh_token FROM tokenguard_tokens").Scan(&rt); err != nil || rt != "rt2" {
		t.Fatalf("the table holds %q, %v", rt, err)
	}
}

// claimEventsThroughTheView: the AFTER trigger wrote the events, the
// default event_id included; the worker's claim (FOR UPDATE SKIP LOCKED)
// and delete through the view, and an insert that names no event_id.
func claimEventsThroughTheView(t *testing.T, db *sql.DB) {
	t.Helper()
	exec(t, db, `INSERT INTO webhook_outbox (type, connection, data) VALUES ('connection.test', 'acme', '{}')`)
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	var types []string
	var ids []int64
	rows, err := tx.Query(`SELECT id, type, event_id FROM webhook_outbox ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id int64
		var typ, eventID string
		if err := rows.Scan(&id, &typ, &eventID); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(eventID, "evt_") {
			t.Errorf("event %d: event_id %q", id, eventID)
		}
		ids, types = append(ids, id), append(types, typ)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if want := []string{"connection.connected", "connection.needs_reauth", "connection.test"}; !slices.Equal(types, want) {
		t.Fatalf("events %v, want %v", types, want)
	}
	// The view's claim locked the table's rows.
	var skipped int
	if err := db.QueryRow("SELECT count(*) FROM (SELECT 1 FROM tokenguard_webhook_outbox FOR UPDATE SKIP LOCKED) x").Scan(&skipped); err != nil || skipped != 0 {
		t.Fatalf("rows not locked by the claim through the view: %d free, %v", skipped, err)
	}
	if _, err := tx.Exec("DELETE FROM webhook_outbox WHERE id = ANY($1)", ids); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// editProviderThroughTheView: a provider added through the view
// (identity, defaults) is announced by the table's trigger on the channel
// every release listens on; the edit's SELECT ... FOR UPDATE through the
// view locks the table's row.
func editProviderThroughTheView(t *testing.T, db *sql.DB, listener *pgx.Conn) {
	t.Helper()
	exec(t, db, "INSERT INTO providers (name, token_url, client_id) VALUES ('crm', 'https://crm.example/token', 'cid') ON CONFLICT (name) DO NOTHING")
	wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := listener.WaitForNotification(wctx)
	if err != nil || n.Channel != "tokenguard_provider_changed" || n.Payload != "crm" {
		t.Fatalf("notification %+v, %v", n, err)
	}
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	var id int64
	if err := tx.QueryRow("SELECT id FROM providers WHERE name = 'crm' FOR UPDATE").Scan(&id); err != nil || id < 1 {
		t.Fatalf("select for update through the view: %d, %v", id, err)
	}
	_, err = db.Exec("SELECT 1 FROM tokenguard_providers WHERE name = 'crm' FOR UPDATE NOWAIT")
	if err == nil || !strings.Contains(err.Error(), "55P03") {
		t.Fatalf("the table's row not locked by FOR UPDATE through the view: %v", err)
	}
}

// disconnectAndTheRestThroughTheViews: DELETE ... USING ... RETURNING
// (tokenctl disconnect), then the lease insert and the connect session's
// identity through their views, an API key and a learned auth style.
func disconnectAndTheRestThroughTheViews(t *testing.T, db *sql.DB) {
	t.Helper()
	var deleted int64
	if err := db.QueryRow(`DELETE FROM tokens AS t USING connections c WHERE c.id = t.connection_id AND c.name = 'acme'
		RETURNING t.version`).Scan(&deleted); err != nil || deleted != 6 {
		t.Fatalf("delete through the view: %d, %v", deleted, err)
	}
	exec(t, db, `INSERT INTO refresh_leases AS l (connection_id, version, holder, until, server_started)
SELECT c.id, 6, gen_random_uuid(), now() + interval '1 minute', pg_postmaster_start_time() FROM connections c WHERE c.name = 'acme'
ON CONFLICT (connection_id) DO UPDATE SET version = EXCLUDED.version`)
	exec(t, db, `INSERT INTO connect_sessions (token_hash, connection, expires_at) VALUES (sha256('s'), 'acme', now() + interval '10 minutes')`)
	exec(t, db, `INSERT INTO api_keys (name, key_hash) VALUES ('ops', sha256('k')) ON CONFLICT (name) DO NOTHING`)
	exec(t, db, `INSERT INTO client_auth_styles (token_url, client_id, style) VALUES ('u', 'c', 'header')
ON CONFLICT (token_url, client_id) DO UPDATE SET style = EXCLUDED.style, updated_at = now()`)
	var leases, sessions, keys, styles int
	if err := db.QueryRow(`SELECT (SELECT count(*) FROM tokenguard_refresh_leases), (SELECT count(*) FROM tokenguard_connect_sessions),
		(SELECT count(*) FROM tokenguard_api_keys), (SELECT count(*) FROM tokenguard_client_auth_styles)`).Scan(&leases, &sessions, &keys, &styles); err != nil ||
		leases != 1 || sessions != 1 || keys != 1 || styles != 1 {
		t.Fatalf("rows written through the views: %d leases, %d sessions, %d keys, %d styles, %v", leases, sessions, keys, styles, err)
	}
}

// An application's own golang-migrate schema_migrations and its own tables
// named as the previous release named tokenguard's (connections, tokens,
// providers, api_keys) are neither read as tokenguard's nor changed.
func TestApplicationTablesOfTheOldNames(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	dbURL := testdb.NewEmpty(t)
	db := open(t, dbURL)
	app := `CREATE TABLE schema_migrations (version bigint NOT NULL PRIMARY KEY, dirty boolean NOT NULL);
INSERT INTO schema_migrations VALUES (20240101120000, false);
CREATE TABLE connections (id serial PRIMARY KEY, peer text NOT NULL);
CREATE TABLE tokens (id serial PRIMARY KEY, user_id int NOT NULL, token text NOT NULL);
CREATE TABLE providers (id serial PRIMARY KEY, name text NOT NULL, kind text NOT NULL);
CREATE TABLE api_keys (id serial PRIMARY KEY, owner text NOT NULL);
INSERT INTO connections (peer) VALUES ('p');
INSERT INTO tokens (user_id, token) VALUES (1, 't');
INSERT INTO providers (name, kind) VALUES ('github', 'oauth');
INSERT INTO api_keys (owner) VALUES ('alice')`
	exec(t, db, app)
	before := schemaOf(t, db)
	if err := migrations.Up(dbURL); err != nil {
		t.Fatal(err)
	}
	var own []string
	for _, line := range schemaOf(t, db) {
		if !strings.Contains(line, "tokenguard_") {
			own = append(own, line)
		}
	}
	if !slices.Equal(own, before) {
		t.Errorf("the application's objects changed:\n%s", diff(before, own))
	}
	var version int64
	var rows string
	if err := db.QueryRow(`SELECT (SELECT version FROM schema_migrations),
		(SELECT string_agg(x, ',') FROM (SELECT peer FROM connections UNION ALL SELECT token FROM tokens
		 UNION ALL SELECT name || kind FROM providers UNION ALL SELECT owner FROM api_keys) r(x))`).Scan(&version, &rows); err != nil ||
		version != 20240101120000 || rows != "p,t,githuboauth,alice" {
		t.Errorf("the application's rows: version %d, %q, %v", version, rows, err)
	}
	if v, _, err := migrations.Version(dbURL); err != nil || v < 12 {
		t.Errorf("tokenguard at version %d, %v", v, err)
	}
}

// A search_path naming a schema that does not exist is ErrSchemaNotFound
// naming it, before anything is created anywhere (not in the next schema
// of the path); a schema that exists gets the tables.
func TestSearchPathNamingAMissingSchema(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	dbURL := testdb.NewEmpty(t)
	db := open(t, dbURL)
	for _, path := range []string{"nosuch", "nosuch,public", `"$user",public,"No Such"`} {
		err := migrations.Up(withSearchPath(t, dbURL, path))
		missing := "nosuch"
		if strings.Contains(path, "No Such") {
			missing = "No Such"
		}
		if !errors.Is(err, domain.ErrSchemaNotFound) || !strings.Contains(err.Error(), `"`+missing+`"`) {
			t.Errorf("search_path %s: %v, want ErrSchemaNotFound naming %q", path, err, missing)
		}
	}
	if err := migrations.Up(withSearchPath(t, dbURL, `"$user"`)); !errors.Is(err, domain.ErrSchemaNotFound) ||
		!strings.Contains(err.Error(), "no schema that exists") {
		t.Errorf(`search_path "$user" (no such schema): %v`, err)
	}
	if got := tables(t, dbURL); len(got) != 0 {
		t.Fatalf("tables created in public: %v", got)
	}
	exec(t, db, `CREATE SCHEMA "Tenant 1"`)
	if err := migrations.Up(withSearchPath(t, dbURL, `"Tenant 1"`)); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM information_schema.tables WHERE table_schema = 'Tenant 1' AND table_name LIKE 'tokenguard\_%'`).Scan(&n); err != nil || n < 9 {
		t.Fatalf("tables in the schema: %d, %v", n, err)
	}
}

// inSchema creates schema in the database at dbURL and returns dbURL with
// the search_path naming it; "" is public, dbURL as it is.
func inSchema(t *testing.T, dbURL, schema string) string {
	t.Helper()
	if schema == "" {
		return dbURL
	}
	exec(t, open(t, dbURL), "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	return withSearchPath(t, dbURL, pgx.Identifier{schema}.Sanitize())
}

// withSearchPath is dbURL with the connection's search_path set.
func withSearchPath(t *testing.T, dbURL, path string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", path)
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20") // pgx reads + as itself
	return u.String()
}

// A role the application's processes connect as, granted the previous
// release's tables, may use the views as it used the tables.
func TestTheViewsTakeTheTablesGrants(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	dbURL := testdb.NewEmpty(t)
	migratePrevious(t, dbURL, 11, migrations.Table)
	db := open(t, dbURL)
	role := fmt.Sprintf("tg_app_%d", time.Now().UnixNano())
	exec(t, db, "CREATE ROLE "+role+" NOLOGIN")
	t.Cleanup(func() {
		_, _ = db.Exec("DROP OWNED BY " + role)
		_, _ = db.Exec("DROP ROLE " + role)
	})
	exec(t, db, "GRANT SELECT, INSERT, UPDATE, DELETE ON connections, tokens TO "+role)
	if err := migrations.Up(dbURL); err != nil {
		t.Fatal(err)
	}
	var ok bool
	if err := db.QueryRow(`SELECT has_table_privilege($1, 'tokens', 'INSERT') AND has_table_privilege($1, 'connections', 'DELETE')
		AND NOT has_table_privilege($1, 'providers', 'SELECT')`, role).Scan(&ok); err != nil || !ok {
		t.Fatalf("the view's privileges for %s: %t, %v", role, ok, err)
	}
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(context.Background(), "SET ROLE "+role+"; INSERT INTO connections (name) VALUES ('acme'); RESET ROLE"); err != nil {
		t.Fatalf("insert through the view as %s: %v", role, err)
	}
}

// The renaming waits for the transactions of the processes still running
// without deadlocking with them: a transaction holding a later table
// (refresh_leases) that then reads an earlier one (connections) while the
// migration waits goes through, and the migration completes after it.
// Holding connections while waiting for refresh_leases would deadlock
// here, and one of the two would fail.
func TestRenamingWaitsForRunningTransactionsWithoutDeadlock(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	dbURL := testdb.NewEmpty(t)
	migratePrevious(t, dbURL, 11, migrations.Table)
	db := open(t, dbURL)
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.Exec("DELETE FROM refresh_leases WHERE version < 0"); err != nil {
		t.Fatal(err)
	}
	up := make(chan error, 1)
	go func() { up <- migrations.Up(dbURL) }()
	// Until the migration waits for refresh_leases (it then queues for
	// ACCESS EXCLUSIVE on it).
	waitfor.Until(t, 30*time.Second, "the migration never queued for ACCESS EXCLUSIVE", func() bool {
		select {
		case err := <-up:
			t.Fatalf("the migration did not wait for the transaction: %v", err)
		default:
		}
		var waiting bool
		if err := db.QueryRow(`SELECT EXISTS (SELECT FROM pg_locks WHERE NOT granted AND mode = 'AccessExclusiveLock'
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting
	})
	var n int
	if err := tx.QueryRow("SELECT count(*) FROM connections").Scan(&n); err != nil {
		t.Fatalf("the running transaction, reading connections while the migration waits: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-up; err != nil {
		t.Fatalf("the migration: %v", err)
	}
	if v, dirty, err := migrations.Version(dbURL); err != nil || v < 12 || dirty {
		t.Fatalf("version %d dirty %t, %v", v, dirty, err)
	}
}
