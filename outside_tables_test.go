package tokenguard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokenguard/tokenguard/internal/release"
	"github.com/tokenguard/tokenguard/internal/sandbox"
)

// appWithTables is an application outside this module with migrations of
// its own, applied by golang-migrate (its default schema_migrations),
// creating tables of the names tokenguard's had before they were
// prefixed: providers, api_keys, tokens, connections. "app migrate" runs
// only those; "app" then embeds tokenguard: Migrate, New, Import, Token.
const appWithTables = `package main

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/golang-migrate/migrate/v4"
	_ "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"golang.org/x/oauth2"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard"
)

//go:embed migrations/*.sql
var appMigrations embed.FS

func main() {
	ctx := context.Background()
	src, err := iofs.New(appMigrations, "migrations")
	if err != nil {
		log.Fatal(err)
	}
	m, err := migrate.NewWithSourceInstance("iofs", src, os.Getenv("MIGRATE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	if err := m.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
		log.Fatal(err)
	}
	if len(os.Args) > 1 && os.Args[1] == "migrate" {
		return
	}
	db, err := gorm.Open(postgres.Open(os.Getenv("DATABASE_URL")), &gorm.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := tokenguard.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	cfg := &oauth2.Config{
		ClientID:     os.Getenv("CLIENT_ID"),
		ClientSecret: os.Getenv("CLIENT_SECRET"),
		Endpoint:     oauth2.Endpoint{TokenURL: os.Getenv("TOKEN_URL"), AuthStyle: oauth2.AuthStyleInHeader},
	}
	tokens, err := tokenguard.New(db, cfg, tokenguard.WithSkew(time.Second))
	if err != nil {
		log.Fatal(err)
	}
	if grant := os.Getenv("GRANT"); grant != "" {
		var tok oauth2.Token
		if err := json.Unmarshal([]byte(grant), &tok); err != nil {
			log.Fatal(err)
		}
		if err := tokens.Import(ctx, "acme", &tok); err != nil {
			log.Fatal(err)
		}
	}
	first, err := tokens.Token(ctx, "acme")
	if err != nil {
		log.Fatal(err)
	}
	time.Sleep(time.Until(first.Expiry) + 100*time.Millisecond) // due: refreshed next
	second, err := tokens.Token(ctx, "acme")
	if err != nil {
		log.Fatal(err)
	}
	var providers []string
	if err := db.Raw("SELECT name FROM providers ORDER BY id").Scan(&providers).Error; err != nil {
		log.Fatal(err)
	}
	if err := tokens.Close(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("rotated", second.AccessToken != first.AccessToken, "providers", providers)
}
`

var appTablesMigrations = map[string]string{
	"migrations/20240101120000_init.up.sql": `CREATE TABLE providers (id serial PRIMARY KEY, name text NOT NULL UNIQUE, kind text NOT NULL);
CREATE TABLE api_keys (id serial PRIMARY KEY, owner text NOT NULL, secret_hash text NOT NULL);
INSERT INTO providers (name, kind) VALUES ('github', 'oauth'), ('stripe', 'key');
INSERT INTO api_keys (owner, secret_hash) VALUES ('alice', 'h1'), ('bob', 'h2');`,
	"migrations/20240101120000_init.down.sql": `DROP TABLE api_keys; DROP TABLE providers;`,
	"migrations/20240301090000_sessions.up.sql": `CREATE TABLE connections (id serial PRIMARY KEY, peer inet NOT NULL);
CREATE TABLE tokens (id serial PRIMARY KEY, api_key_id int NOT NULL REFERENCES api_keys (id), token text NOT NULL);
INSERT INTO connections (peer) VALUES ('10.0.0.1');
INSERT INTO tokens (api_key_id, token) VALUES (1, 'session-1');`,
	"migrations/20240301090000_sessions.down.sql": `DROP TABLE tokens; DROP TABLE connections;`,
}

// An application with its own golang-migrate schema_migrations and its own
// providers, api_keys, tokens and connections tables, with rows, embeds
// tokenguard from outside the module: Migrate, New, Import and Token work
// (a refresh included) and leave every object and row of the application
// as it was, on the first start and on a restart.
func TestOutsideApplicationWithTablesOfItsOwn(t *testing.T) {
	t.Run("ThisRelease", func(t *testing.T) { testAppWithTables(t, ".", false) })
	// The control: the previous release, whose tables had the generic
	// names, fails there or changes the application's tables.
	t.Run("ControlPreviousRelease", func(t *testing.T) {
		if testing.Short() {
			t.Skip("needs Postgres")
		}
		root := t.TempDir()
		if err := release.Extract(release.Previous, root); err != nil {
			t.Fatal(err)
		}
		testAppWithTables(t, root, true)
	})
}

func testAppWithTables(t *testing.T, root string, control bool) {
	w := newWorld(t, sandbox.Options{AccessTokenLifespan: 2 * time.Second})
	_, bin := buildOutsideWith(t, outsideModuleAt(t, root, appWithTables, appTablesMigrations, "github.com/golang-migrate/migrate/v4"))
	u, err := url.Parse(w.url)
	if err != nil {
		t.Fatal(err)
	}
	u.Scheme = "pgx5"
	env := append(os.Environ(), "DATABASE_URL="+w.url, "MIGRATE_URL="+u.String(), "TOKEN_URL="+w.oauth.Endpoint.TokenURL,
		"CLIENT_ID="+w.oauth.ClientID, "CLIENT_SECRET="+w.oauth.ClientSecret)
	tryApp := func(extraEnv []string, args ...string) (string, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(env, extraEnv...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			err = fmt.Errorf("app %v: %w\nstdout:\n%s\nstderr:\n%s", args, err, out, stderr.String())
		}
		return string(out), err
	}

	if _, err := tryApp(nil, "migrate"); err != nil {
		t.Fatal(err)
	}
	before := appObjects(t, w.url)
	if !strings.Contains(before, "20240301090000") || !strings.Contains(before, "session-1") {
		t.Fatalf("the application's migrations did not run: %s", before)
	}
	grant, _ := json.Marshal(w.grant(t))
	want := "rotated true providers [github stripe]\n"
	if control {
		out, err := tryApp([]string{"GRANT=" + string(grant)})
		if after := appObjects(t, w.url); err == nil && out == want && after == before {
			t.Fatal("control: the previous release worked beside the application's tables: the test would not see a collision")
		}
		t.Logf("control: the previous release: %v", err)
		return
	}
	runApp := func(extraEnv []string, args ...string) string {
		t.Helper()
		out, err := tryApp(extraEnv, args...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if out := runApp([]string{"GRANT=" + string(grant)}); out != want {
		t.Fatalf("the app printed %q, want %q", out, want)
	}
	if after := appObjects(t, w.url); after != before {
		t.Fatalf("tokenguard changed the application's objects or rows:\nbefore %s\nafter  %s", before, after)
	}
	if out := runApp(nil); out != want { // a restart: both migrate again
		t.Fatalf("the app printed %q on a restart, want %q", out, want)
	}
	if after := appObjects(t, w.url); after != before {
		t.Fatalf("a restart changed the application's objects or rows:\nbefore %s\nafter  %s", before, after)
	}
	if st := w.provider.Stats(); st.Refreshes < 2 || st.RefreshReuse != 0 {
		t.Fatalf("provider: %d refreshes, %d reuses; want one or more per run and none reused", st.Refreshes, st.RefreshReuse)
	}
}

// appObjects describes every object in the database not named tokenguard_*
// (its columns, defaults, indexes, constraints) and every row of the
// application's tables, schema_migrations included.
func appObjects(t *testing.T, dbURL string) string {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var out string
	err = c.QueryRow(ctx, `SELECT concat_ws(E'\n',
  (SELECT string_agg(c.relname || ' ' || c.relkind::text, ', ' ORDER BY c.relname) FROM pg_class c
   WHERE c.relnamespace = 'public'::regnamespace AND c.relname NOT LIKE 'tokenguard\_%'),
  (SELECT string_agg(table_name || '.' || column_name || ' ' || data_type || ' ' || coalesce(column_default, ''), ', '
          ORDER BY table_name, ordinal_position)
   FROM information_schema.columns WHERE table_schema = 'public' AND table_name NOT LIKE 'tokenguard\_%'),
  (SELECT string_agg(conname || ' ' || pg_get_constraintdef(oid), ', ' ORDER BY conname) FROM pg_constraint
   WHERE connamespace = 'public'::regnamespace AND conname NOT LIKE 'tokenguard\_%'),
  (SELECT json_agg(s)::text FROM schema_migrations s),
  (SELECT json_agg(p ORDER BY id)::text FROM providers p),
  (SELECT json_agg(a ORDER BY id)::text FROM api_keys a),
  (SELECT json_agg(x ORDER BY id)::text FROM connections x),
  (SELECT json_agg(k ORDER BY id)::text FROM tokens k))`).Scan(&out)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
