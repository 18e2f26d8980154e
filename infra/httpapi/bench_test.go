package httpapi_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// The two benchmarks send requests open loop at a fixed rate, alternating
// segments of the measured route and its baseline so that both see the
// same machine, and report p50/p99 latencies and their differences:
//
//	go test -run '^$' -bench 'AtRate' ./infra/httpapi/
const (
	benchRate     = 1000 // requests per second
	benchSegment  = 500  // requests per segment
	benchSegments = 6    // per side
)

// BenchmarkTokenAPIAtRate: GET /connections/{name}/token with a cached
// token, against an empty handler behind the same kind of listener; and
// the database transactions per request (the cached token costs none;
// Run's heartbeat commits one a second).
func BenchmarkTokenAPIAtRate(b *testing.B) {
	r := newRig(b, time.Hour)
	empty := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte("{}"))
	}))
	b.Cleanup(empty.Close)
	token := func() *http.Request {
		req, _ := http.NewRequest(http.MethodGet, r.server.URL+"/connections/acme/token", nil)
		req.Header.Set("Authorization", "Bearer "+apiKey)
		return req
	}
	base := func() *http.Request {
		req, _ := http.NewRequest(http.MethodGet, empty.URL+"/", nil)
		req.Header.Set("Authorization", "Bearer "+apiKey)
		return req
	}
	// The transactions of the run minus those of as long a time idle
	// (Run's heartbeat) are the requests'.
	xacts := dbXacts(b, r.dbURL)
	idleStart, idle0 := time.Now(), xacts()
	time.Sleep(3 * time.Second)
	idle := float64(xacts()-idle0) / time.Since(idleStart).Seconds()
	start, before := time.Now(), xacts()
	measured, baseline := compareAtRate(b, token, base)
	time.Sleep(1100 * time.Millisecond) // the pool's backends report their statistics at most once a second
	perReq := (float64(xacts()-before) - idle*time.Since(start).Seconds()) / float64(benchSegment*benchSegments)
	b.ReportMetric(idle, "idle-db-xacts/s")
	report(b, measured, baseline, "empty")
	b.ReportMetric(perReq, "db-xacts/req")
}

// BenchmarkProxyAtRate: GET through /connections/{name}/proxy/fast
// against the same call straight to the upstream with the token.
func BenchmarkProxyAtRate(b *testing.B) {
	r := newRig(b, time.Hour)
	tok := r.token(r.do("GET", "/connections/acme/token", nil))
	proxied := func() *http.Request {
		req, _ := http.NewRequest(http.MethodGet, r.server.URL+"/connections/acme/proxy/fast", nil)
		req.Header.Set("Authorization", "Bearer "+apiKey)
		return req
	}
	direct := func() *http.Request {
		req, _ := http.NewRequest(http.MethodGet, r.upstream.URL+"/fast", nil)
		req.Header.Set("Authorization", "Bearer "+tok.AccessToken)
		return req
	}
	conns := r.upstreamConns.Load()
	measured, baseline := compareAtRate(b, proxied, direct)
	report(b, measured, baseline, "direct")
	// Both the proxy and the direct client keep their connections: a
	// proxy that dropped them would dial one per call.
	b.ReportMetric(float64(r.upstreamConns.Load()-conns), "upstream-conns")
}

// compareAtRate runs benchSegments segments of each request kind in turn
// and returns their sorted latencies.
func compareAtRate(b *testing.B, measured, baseline func() *http.Request) (m, base []time.Duration) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConns: 512, MaxIdleConnsPerHost: 512}}
	b.Cleanup(client.CloseIdleConnections)
	atRate(b, client, benchSegment/2, measured) // warm up connections and caches
	atRate(b, client, benchSegment/2, baseline)
	b.ResetTimer()
	for range benchSegments {
		m = append(m, atRate(b, client, benchSegment, measured)...)
		base = append(base, atRate(b, client, benchSegment, baseline)...)
	}
	b.StopTimer()
	slices.Sort(m)
	slices.Sort(base)
	return m, base
}

// atRate sends n requests, one every 1/benchRate whatever the previous
// ones are doing, and returns their latencies.
func atRate(b *testing.B, c *http.Client, n int, newReq func() *http.Request) []time.Duration {
	out := make([]time.Duration, n)
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Second / benchRate)
	defer tick.Stop()
	for i := range n {
		<-tick.C
		req := newReq()
		wg.Go(func() {
			start := time.Now()
			resp, err := c.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			out[i] = time.Since(start)
			if resp.StatusCode != http.StatusOK {
				b.Errorf("%s: %d", req.URL.Path, resp.StatusCode)
			}
		})
	}
	wg.Wait()
	return out
}

func pct(sorted []time.Duration, p float64) float64 {
	return float64(sorted[int(p*float64(len(sorted)-1))]) / float64(time.Millisecond)
}

func report(b *testing.B, m, base []time.Duration, baseName string) {
	b.ReportMetric(pct(m, 0.50), "p50-ms")
	b.ReportMetric(pct(m, 0.99), "p99-ms")
	b.ReportMetric(pct(base, 0.50), baseName+"-p50-ms")
	b.ReportMetric(pct(base, 0.99), baseName+"-p99-ms")
	b.ReportMetric(pct(m, 0.99)-pct(base, 0.99), "p99-over-"+baseName+"-ms")
	b.ReportMetric(pct(m, 0.99)/pct(base, 0.99), "p99-ratio")
	b.ReportMetric(0, "ns/op")
}

// dbXacts returns a function that reads the committed and rolled back
// transactions of the database at dbURL (its own reads included: two per
// call).
func dbXacts(b *testing.B, dbURL string) func() int64 {
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close(ctx) })
	return func() int64 {
		_, _ = c.Exec(ctx, "SELECT pg_stat_force_next_flush()")
		var n int64
		if err := c.QueryRow(ctx, "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()").Scan(&n); err != nil {
			b.Fatal(err)
		}
		return n
	}
}
