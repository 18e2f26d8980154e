package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/tokenguard/tokenguard/internal/testdb"
)

// An idle connection is pinged only when the server has dropped it.
func TestShouldPingOnlyAConnectionTheServerDropped(t *testing.T) {
	ctx := context.Background()
	url := testdb.New(t)
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	idle := stdlib.ShouldPingParams{Conn: c, IdleDuration: 2 * time.Second}
	if shouldPing(ctx, idle) {
		t.Fatal("a live, idle connection would be pinged")
	}
	other, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	if _, err := other.Exec(ctx, "SELECT pg_terminate_backend($1)", c.PgConn().PID()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !shouldPing(ctx, idle) {
		if time.Now().After(deadline) {
			t.Fatal("a connection whose backend was terminated would be reused without a ping")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if shouldPing(ctx, stdlib.ShouldPingParams{Conn: c, IdleDuration: 500 * time.Millisecond}) {
		t.Error("a connection used within the second would be pinged (pgx's rule is not to)")
	}
}
