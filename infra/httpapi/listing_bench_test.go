package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/tokenguard/tokenguard"
	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/httpapi"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/internal/testdb"
	"github.com/tokenguard/tokenguard/repository"
)

// listingKeys are an unlimited key and one limited to tenant-a-*.
type listingKeys struct{}

func (listingKeys) Verify(_ context.Context, s domain.Secret) (domain.KeyAccess, error) {
	switch s.Reveal() {
	case "tgk_all":
		return domain.KeyAccess{ID: 1, Name: "all"}, nil
	case "tgk_tenant_a":
		return domain.KeyAccess{ID: 2, Name: "tenant-a", Connections: []string{"tenant-a-*"}}, nil
	}
	return domain.KeyAccess{}, domain.ErrUnauthorized
}

// listingConnections is how many connections BenchmarkConnectionsListing
// stores: ten tenants, tenant-a-* a tenth of them.
const listingConnections = 100_000

// BenchmarkConnectionsListing: GET /connections pages for a key limited
// to tenant-a-* against the same pages for an unlimited key, over
// listingConnections connections, taking turns in segments so that both
// see the same machine; p50/p99 of each and the ratio of the p99s. The
// pages: the first (limit 50), one in the middle of tenant-a, and the
// last one past tenant-a (limit 1, after tenant-a-zzz: empty for the
// limited key).
//
//	go test -run '^$' -bench 'ConnectionsListing' ./infra/httpapi/
func BenchmarkConnectionsListing(b *testing.B) {
	if testing.Short() {
		b.Skip("needs Postgres")
	}
	ctx := context.Background()
	db, err := gorm.Open(postgres.Open(testdb.NewEmpty(b)), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		b.Fatal(err)
	}
	if err := tokenguard.Migrate(ctx, db); err != nil {
		b.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO tokenguard_connections (name)
SELECT 'tenant-' || chr(97 + i % 10) || '-' || lpad((i / 10)::text, 6, '0') FROM generate_series(0, ` + fmt.Sprint(listingConnections-1) + `) i`,
		`INSERT INTO tokenguard_tokens (connection_id, access_token, refresh_token, obtained_at, version)
SELECT id, 'at', 'rt', now(), 1 FROM tokenguard_connections`,
		`ANALYZE`,
	} {
		if err := db.Exec(q).Error; err != nil {
			b.Fatal(err)
		}
	}
	repo := repository.NewTokenRepository(db, tokencrypt.Plaintext{})
	srv := httptest.NewUnstartedServer(nil)
	srv.Config.Handler = httpapi.New(httpapi.Deps{Connections: repo, Keys: listingKeys{}, Log: slog.New(slog.DiscardHandler),
		Edges: httpapi.Edges{Hosts: []string{srv.Listener.Addr().String()}, Rate: 1e6, Burst: 1e6}}).Handler()
	srv.Start()
	b.Cleanup(srv.Close)

	pages := []string{"limit=50", "limit=50&after=tenant-a-005000", "limit=1&after=tenant-a-zzz"}
	wantLimited := []int{50, 50, 0}
	get := func(key, query string) (time.Duration, int) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/connections?"+query, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		start := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		var body struct{ Connections []json.RawMessage }
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		took := time.Since(start)
		if resp.StatusCode != http.StatusOK || json.Unmarshal(data, &body) != nil {
			b.Fatalf("%s: %d %s", query, resp.StatusCode, data)
		}
		return took, len(body.Connections)
	}
	segment := func(key string, n int, out *[]time.Duration) {
		for i := range n {
			p := i % len(pages)
			took, got := get(key, pages[p])
			if key == "tgk_tenant_a" && got != wantLimited[p] {
				b.Fatalf("limited key, %s: %d connections, want %d", pages[p], got, wantLimited[p])
			}
			if out != nil {
				*out = append(*out, took)
			}
		}
	}
	const perSegment, segments = 150, 6
	segment("tgk_all", perSegment, nil) // warm up connections, caches and plans
	segment("tgk_tenant_a", perSegment, nil)
	var limited, unlimited []time.Duration
	b.ResetTimer()
	for range segments {
		segment("tgk_tenant_a", perSegment, &limited)
		segment("tgk_all", perSegment, &unlimited)
	}
	b.StopTimer()
	slices.Sort(limited)
	slices.Sort(unlimited)
	b.ReportMetric(pct(limited, 0.50), "p50-ms")
	b.ReportMetric(pct(limited, 0.99), "p99-ms")
	b.ReportMetric(pct(unlimited, 0.50), "unlimited-p50-ms")
	b.ReportMetric(pct(unlimited, 0.99), "unlimited-p99-ms")
	b.ReportMetric(pct(limited, 0.99)/pct(unlimited, 0.99), "p99-ratio")
	b.ReportMetric(0, "ns/op")
}
