package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// testListingCost is the review's finding 4 against the real server: with
// 10,000 connections, a page of GET /connections for a key limited to
// tenant-a-*, past its last connection (limit=1&after=tenant-a-zzz: an
// empty answer), costs the database about what the same page costs for a
// key of every right (the control, one query): the key's patterns are the
// query's condition, not a filter over a walk of the whole table (about
// 4,500 queries a page). Transactions are counted, not timed.
func testListingCost(t *testing.T, bin string) {
	s := newStack(t, bin, stackOpts{lifetime: time.Hour, skew: 30 * time.Second})
	s.migrate()
	sql(t, s.dbURL, `INSERT INTO tokenguard_connections (name)
SELECT 'tenant-' || chr(97 + i % 10) || '-' || lpad((i / 10)::text, 5, '0') FROM generate_series(0, 9999) i`)
	sql(t, s.dbURL, `INSERT INTO tokenguard_tokens (connection_id, access_token, refresh_token, obtained_at, version)
SELECT id, 'at', 'rt', now(), 1 FROM tokenguard_connections`)
	server := s.start("server")
	s.waitHealthy(server)
	r := run(t, bin, "tokenctl", s.env, "", "apikey", "create", "--name", "tenant-a", "--connections", "tenant-a-*", "--scopes", "connections:read")
	tenantA := strings.TrimSpace(r.stdout)
	if r.code != 0 || !strings.HasPrefix(tenantA, "tgk_") {
		t.Fatalf("apikey create: %d %s", r.code, r.stderr)
	}
	xacts := func() int64 {
		t.Helper()
		var n int64
		if err := pgxQueryRow(t, s.dbURL, `SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()`, &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	const pages = 5
	cost := func(key, wantBody string) int64 {
		t.Helper()
		s.doWith(key, http.MethodGet, "/connections?limit=1&after=tenant-a-zzz", "") // the key verified and cached
		time.Sleep(1100 * time.Millisecond)                                          // backends report their statistics at most once a second
		before := xacts()
		for range pages {
			code, body := s.doWith(key, http.MethodGet, "/connections?limit=1&after=tenant-a-zzz", "")
			if code != http.StatusOK || !strings.HasPrefix(body, wantBody) {
				t.Fatalf("GET /connections?limit=1&after=tenant-a-zzz: %d %.200s, want %s", code, body, wantBody)
			}
		}
		time.Sleep(1100 * time.Millisecond)
		return xacts() - before
	}
	all := cost(s.key, `{"connections":[{"connection":"tenant-b-00000"`)
	limited := cost(tenantA, `{"connections":[],"next":null}`)
	t.Logf("%d pages: %d transactions for the key limited to tenant-a-*, %d for the key of every right", pages, limited, all)
	// Backends report their statistics late (at most once a second, idle
	// ones later): a margin of 10 a page, where a walk costs thousands.
	if limited > all+10*pages {
		t.Errorf("%d pages for the key limited to tenant-a-*: %d transactions, the key of every right's %d: the listing walks the table", pages, limited, all)
	}
	s.stop(server)
}
