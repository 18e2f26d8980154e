package bench_test

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokenguard/tokenguard/internal/testdb"
)

// benchConnections is how many connections the benchmarks may hold on the
// server at once: the refresh storm's peak, a peer design's three pools of
// 20 at its storm beside the other designs' idle connections, was 84 on a
// stock Postgres (max_connections 100, 97 for clients).
const benchConnections = 90

// standbyBench is the -bench pattern of `make bench`'s line for
// BenchmarkRefreshStormStandby, whose clusters are its own: alone, it
// needs nothing of the test server (benchPrecheck).
const standbyBench = "^BenchmarkRefreshStormStandby$"

// benchPrecheck, when benchmarks are asked for (make bench), checks that
// the Postgres found (internal/testdb) can hold them, and otherwise says
// in one line what is missing and exits, instead of failing later with
// "too many clients". The standby benchmark alone runs on clusters of its
// own.
func benchPrecheck() {
	flag.Parse()
	if b := flag.Lookup("test.bench"); b == nil || b.Value.String() == "" || b.Value.String() == standbyBench {
		return
	}
	if err := benchServer(); err != nil {
		fmt.Fprintln(os.Stderr, "make bench:", testdb.OneLine(err))
		os.Exit(1)
	}
}

func benchServer() error {
	admin, err := testdb.ServerURL()
	if err != nil {
		return fmt.Errorf("needs a Postgres server (%s, 127.0.0.1:5432 with user postgres and trust, or initdb): %v", testdb.EnvURL, err)
	}
	where := admin
	if u, err := url.Parse(admin); err == nil {
		where = u.Host
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return fmt.Errorf("the Postgres at %s does not answer: %v", where, err)
	}
	defer conn.Close(ctx)
	var free, max int
	err = conn.QueryRow(ctx, `SELECT current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int
		- (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'),
		current_setting('max_connections')::int`).Scan(&free, &max)
	if err != nil {
		return fmt.Errorf("the Postgres at %s: read max_connections: %v", where, err)
	}
	if free < benchConnections {
		return fmt.Errorf("the Postgres at %s has %d connections free (max_connections %d); the benchmarks hold up to %d at once: raise max_connections (e.g. 300) or stop what holds them", where, free, max, benchConnections)
	}
	return nil
}
