package migrations_test

import (
	"context"
	"database/sql"
	"testing"

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
		if !got["tokens"] || !got["connections"] {
			t.Fatalf("round %d: after up, tables = %v", round, got)
		}
		if v, dirty, err := migrations.Version(url); err != nil || v == 0 || dirty {
			t.Fatalf("round %d: version %d dirty %v err %v", round, v, dirty, err)
		}
		if err := migrations.Down(url); err != nil {
			t.Fatalf("round %d down: %v", round, err)
		}
		got = tables(t, url)
		if got["tokens"] || got["connections"] {
			t.Fatalf("round %d: after down, tables = %v", round, got)
		}
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
	if _, err := db.ExecContext(ctx, "INSERT INTO connections (name) VALUES ('acme')"); err != nil {
		t.Fatal(err)
	}
	bad := map[string]string{
		"bad name":             "INSERT INTO connections (name) VALUES ('has space')",
		"empty refresh token":  "INSERT INTO tokens (connection_id, access_token, refresh_token, obtained_at, version) SELECT id, 'a', '', now(), 1 FROM connections",
		"empty access token":   "INSERT INTO tokens (connection_id, access_token, refresh_token, obtained_at, version) SELECT id, '', 'r', now(), 1 FROM connections",
		"version 0":            "INSERT INTO tokens (connection_id, access_token, refresh_token, obtained_at, version) SELECT id, 'a', 'r', now(), 0 FROM connections",
		"unknown status":       "INSERT INTO tokens (connection_id, access_token, refresh_token, obtained_at, version, status) SELECT id, 'a', 'r', now(), 1, 'zombie' FROM connections",
		"null refresh token":   "INSERT INTO tokens (connection_id, access_token, refresh_token, obtained_at, version) SELECT id, 'a', NULL, now(), 1 FROM connections",
		"unregistered conn id": "INSERT INTO tokens (connection_id, access_token, refresh_token, obtained_at, version) VALUES (424242, 'a', 'r', now(), 1)",
	}
	for name, stmt := range bad {
		if _, err := db.ExecContext(ctx, stmt); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO tokens (connection_id, access_token, refresh_token, obtained_at, version) SELECT id, 'a', 'r', now(), 1 FROM connections"); err != nil {
		t.Errorf("valid row refused: %v", err)
	}
}
