package bench_test

import (
	"strconv"
	"testing"

	"github.com/tokenguard/tokenguard/internal/testdb"
	"github.com/tokenguard/tokenguard/internal/testworld"
)

// The benchmarks run in the use case's test world (internal/testworld): a
// real Postgres and the strict sandbox provider.

func TestMain(m *testing.M) {
	benchPrecheck()
	testdb.Main(m)
}

const conn = testworld.Conn

func connName(i int) string { return "conn-" + strconv.Itoa(i) }

// seedConnections stores n connections with distinct long-lived tokens in
// one statement per table (the provider is not involved).
func seedConnections(tb testing.TB, s *testworld.Stack, n int) {
	tb.Helper()
	err := s.DB.Exec(`INSERT INTO tokenguard_connections (name) SELECT 'conn-' || g FROM generate_series(0, ?) g`, n-1).Error
	if err == nil {
		err = s.DB.Exec(`INSERT INTO tokenguard_tokens (connection_id, access_token, refresh_token, expiry, obtained_at, version)
			SELECT id, md5(random()::text) || md5(random()::text), md5(random()::text), now() + interval '1 hour', now(), 1
			FROM tokenguard_connections WHERE name LIKE 'conn-%'`).Error
	}
	if err != nil {
		tb.Fatal(err)
	}
}
