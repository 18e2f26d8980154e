package testdb_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/tokenguard/tokenguard/internal/pgserver"
	"github.com/tokenguard/tokenguard/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

func TestNewGivesMigratedDatabaseDroppedAtEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	var name string
	t.Run("use", func(t *testing.T) {
		db, err := sql.Open("pgx", testdb.New(t))
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		var n int
		if err := db.QueryRow("SELECT count(*) FROM information_schema.tables WHERE table_name = 'tokenguard_connections'").Scan(&n); err != nil || n != 1 {
			t.Fatalf("migrated table connections: count %d, %v", n, err)
		}
		if err := db.QueryRow("SELECT current_database()").Scan(&name); err != nil {
			t.Fatal(err)
		}
	})
	admin, err := sql.Open("pgx", testdb.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var n int
	if err := admin.QueryRow("SELECT count(*) FROM pg_database WHERE datname = $1", name).Scan(&n); err != nil || n != 0 {
		t.Fatalf("database %s still there after its test: count %d, %v", name, n, err)
	}
}

// TestHelperThrowAway is the test binary run by
// TestThrowAwayClusterThroughTestdb with TESTDB_SKIP set.
func TestHelperThrowAway(t *testing.T) {
	if os.Getenv("TESTDB_HELPER") == "" {
		t.Skip("helper process only")
	}
	testdb.New(t)
	fmt.Println("url", testdb.URL(t))
}

// With every earlier step skipped, a test binary gets its databases from a
// throw-away cluster, which is gone once the binary has exited.
func TestThrowAwayClusterThroughTestdb(t *testing.T) {
	if testing.Short() {
		t.Skip("starts postgres")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperThrowAway$", "-test.count=1")
	cmd.Env = append(os.Environ(), "TESTDB_HELPER=1", testdb.EnvSkip+"=env,docker,local")
	out, err := cmd.CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "no initdb and postgres") {
			t.Skipf("no initdb here: %s", out)
		}
		t.Fatalf("helper failed: %v\n%s", err, out)
	}
	var u string
	for sc := bufio.NewScanner(strings.NewReader(string(out))); sc.Scan(); {
		if rest, ok := strings.CutPrefix(sc.Text(), "url "); ok {
			u = rest
		}
	}
	if !strings.HasPrefix(u, "postgres://postgres@127.0.0.1:") || strings.Contains(u, ":5432/") {
		t.Fatalf("helper's server %q is not a throw-away cluster:\n%s", u, out)
	}
	if err := pgserver.Ping(context.Background(), u, 2*time.Second); err == nil {
		t.Fatalf("throw-away cluster %s still answers after its test binary exited", u)
	}
}
