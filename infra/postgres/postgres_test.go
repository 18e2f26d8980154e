package postgres_test

import (
	"context"
	"sync"
	"testing"

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
