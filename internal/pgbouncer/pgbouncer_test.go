package pgbouncer_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tokenguard/tokenguard/internal/pgbouncer"
	"github.com/tokenguard/tokenguard/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// Through the bouncer in transaction mode, one client's session setting
// shows up in another client's transaction (they take turns on one server
// connection; the control, directly, does not), and pgx in ExecMode runs
// statements with parameters.
func TestTransactionPooling(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres and pgbouncer")
	}
	if _, err := pgbouncer.Binary(); err != nil {
		t.Skip(err)
	}
	direct := testdb.New(t)
	ctx := context.Background()
	b, err := pgbouncer.Start(ctx, testdb.URL(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	pooled, err := b.URL(direct)
	if err != nil {
		t.Fatal(err)
	}
	leaks := func(u string) bool {
		a, err := pgx.Connect(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close(ctx)
		other, err := pgx.Connect(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close(ctx)
		if _, err := a.Exec(ctx, "SET statement_timeout = '12345ms'"); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := other.QueryRow(ctx, "SELECT $1::int + 1", 1).Scan(&n); err != nil || n != 2 {
			t.Fatalf("query with a parameter: %d, %v", n, err)
		}
		var got string
		if err := other.QueryRow(ctx, "SHOW statement_timeout").Scan(&got); err != nil {
			t.Fatal(err)
		}
		return got == "12345ms"
	}
	if leaks(direct) {
		t.Fatal("control: a direct session saw another's setting")
	}
	if !leaks(pooled) {
		t.Fatal("through the bouncer, sessions did not share the server connection: not transaction pooling")
	}
}

func TestTransactionsCounted(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres and pgbouncer")
	}
	if _, err := pgbouncer.Binary(); err != nil {
		t.Skip(err)
	}
	direct := testdb.New(t)
	ctx := context.Background()
	b, err := pgbouncer.Start(ctx, testdb.URL(t), 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	pooled, _ := b.URL(direct)
	c, err := pgx.Connect(ctx, pooled)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	for range 5 {
		if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
	}
	cfg, _ := pgx.ParseConfig(direct)
	if n, err := b.Transactions(ctx, cfg.User, cfg.Database); err != nil || n < 5 {
		t.Fatalf("transactions of %s: %d, %v; want at least 5", cfg.Database, n, err)
	}
	if n, err := b.Transactions(ctx, cfg.User, "nobody"); err != nil || n != 0 {
		t.Fatalf("transactions of another database: %d, %v", n, err)
	}
}
