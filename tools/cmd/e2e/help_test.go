package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tokenguard/tokenguard/internal/testdb"
)

// Every binary and every tokenctl command answers --help and -h with its
// usage and the environment variables it reads, exits 0 and starts
// nothing: the database it is pointed at has no table afterwards (the
// server migrates on start) and the server, which would serve until
// stopped, returns.
func TestHelpOnEveryBinary(t *testing.T) {
	bin := buildApps(t)
	if out, err := exec.Command("go", "build", "-o", filepath.Join(bin, "demo"), "github.com/tokenguard/tokenguard/tools/cmd/demo").CombinedOutput(); err != nil {
		t.Fatalf("go build demo: %v\n%s", err, out)
	}
	dbURL := testdb.NewEmpty(t)
	env := append(baseEnv(), "DATABASE_URL="+dbURL, "HTTP_ADDR=127.0.0.1:0")
	for _, c := range []struct {
		name string
		args []string
		want string // a variable the usage names
	}{
		{"server", nil, "DATABASE_URL"}, {"worker", nil, "WORKER_CONCURRENCY"}, {"batch", nil, "OAUTH_TOKEN_URL"},
		{"tokenctl", nil, "DATABASE_URL"}, {"tokenctl", []string{"migrate"}, "MIGRATE_DATABASE_URL"},
		{"tokenctl", []string{"import"}, "DATABASE_URL"}, {"tokenctl", []string{"status"}, "DATABASE_URL"},
		{"tokenctl", []string{"disconnect"}, "DATABASE_URL"}, {"tokenctl", []string{"reactivate"}, "DATABASE_URL"},
		{"tokenctl", []string{"rotate-key"}, "TOKEN_ENCRYPTION_KEYS"}, {"tokenctl", []string{"check"}, "OAUTH_CLIENT_SECRET"},
		{"tokenctl", []string{"apikey"}, "DATABASE_URL"}, {"tokenctl", []string{"apikey", "create"}, "DATABASE_URL"},
		{"tokenctl", []string{"provider"}, "DATABASE_URL"}, {"tokenctl", []string{"provider", "add"}, "DATABASE_URL"},
		{"sandbox", nil, "SANDBOX_CLIENT_SECRET"}, {"sandbox", []string{"grant"}, "SANDBOX_CLIENT_SECRET"},
		{"demo", nil, "DATABASE_URL"},
	} {
		for _, h := range []string{"--help", "-h"} {
			args := append(append([]string(nil), c.args...), h)
			name := strings.Join(append([]string{c.name}, args...), " ")
			r := run(t, bin, c.name, env, "", args...)
			out := r.stdout + r.stderr
			if r.code != 0 || !strings.Contains(strings.ToLower(out), "usage") || !strings.Contains(out, c.want) {
				t.Errorf("%s: exit %d, want 0 and a usage naming %s; printed:\n%s", name, r.code, c.want, out)
			}
		}
	}
	conn, err := pgx.Connect(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var tables int
	if err := conn.QueryRow(context.Background(),
		"SELECT count(*) FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')").Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Fatalf("%d tables after --help; want none (nothing started, nothing migrated)", tables)
	}

}
