package postgres_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	gormpg "gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/tokenguard/tokenguard/infra/postgres"
	"github.com/tokenguard/tokenguard/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// A pool busy at its size keeps its connections: bursts of queries, each
// as many at once as the pool holds, run on the same backends instead of
// closing connections on return and opening new ones (a fork of a
// Postgres backend each) for the next burst.
func TestPoolKeepsItsConnectionsThroughBursts(t *testing.T) {
	const size = 10
	db, err := postgres.Open(context.Background(), testdb.New(t), postgres.Pool{MaxOpenConns: size}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = postgres.Close(db) })
	var mu sync.Mutex
	backends := map[int]bool{}
	for range 20 {
		var wg sync.WaitGroup
		for range size {
			wg.Go(func() {
				var pid int
				// pg_sleep keeps each query on its connection long enough
				// for the burst to use the whole pool.
				if err := db.Raw("SELECT pg_backend_pid() FROM pg_sleep(0.01)").Scan(&pid).Error; err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				backends[pid] = true
				mu.Unlock()
			})
		}
		wg.Wait()
	}
	if len(backends) > size {
		t.Errorf("20 bursts of %d queries ran on %d backends: the pool closed and reopened connections (at most %d)", size, len(backends), size)
	}
}

// A connection the server dropped while it sat idle in the pool (a
// restart, a failover, pg_terminate_backend) is not handed out: the next
// query runs on a new one. A pool that never pings idle connections, the
// broken strategy beside it, fails that query.
func TestPoolReplacesAConnectionTheServerDropped(t *testing.T) {
	ctx := context.Background()
	url := testdb.New(t)
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close(ctx) })
	db, err := postgres.Open(ctx, url, postgres.Pool{MaxOpenConns: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = postgres.Close(db) })
	never, err := gorm.Open(gormpg.New(gormpg.Config{DSN: url, OptionOpenDB: []stdlib.OptionOpenDB{
		stdlib.OptionShouldPing(func(context.Context, stdlib.ShouldPingParams) bool { return false }),
	}}), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = postgres.Close(never) })

	pid := func(db *gorm.DB) (int, error) {
		var pid int
		err := db.Raw("SELECT pg_backend_pid()").Scan(&pid).Error
		return pid, err
	}
	first, err := pid(db)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // past pgx's second of trust
	if again, err := pid(db); err != nil || again != first {
		t.Fatalf("a live idle connection was not reused: backend %d, then %d (%v)", first, again, err)
	}
	neverFirst, err := pid(never)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend($1), pg_terminate_backend($2)", first, neverFirst); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)
	if after, err := pid(db); err != nil || after == first {
		t.Fatalf("the dropped connection was handed out: backend %d, then %d (%v)", first, after, err)
	}
	if _, err := pid(never); err == nil {
		t.Error("the broken strategy did not fail: a pool that never pings used the dropped connection without an error")
	}
}
