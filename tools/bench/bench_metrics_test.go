package bench_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/infra/metrics"
	"github.com/tokenguard/tokenguard/internal/testworld"
	"github.com/tokenguard/tokenguard/usecase"
)

// BenchmarkTokenHotMetrics is BenchmarkTokenHot's hot path with the
// Prometheus observer the apps use: every call counts a cache lookup. Run
// together with BenchmarkTokenHot (-bench TokenHot) to compare.
func BenchmarkTokenHotMetrics(b *testing.B) {
	quiet(b)
	w := testworld.New(b, time.Hour)
	plain, pq := w.ListeningStack(b, usecase.Options{})
	observed, oq := w.ListeningStack(b, usecase.Options{Observer: metrics.New(metrics.Options{})})
	w.Connect(b, plain)
	plain.WaitCached(b, pq)
	observed.WaitCached(b, oq)
	ctx := context.Background()

	// Side by side, so that a noisy machine slows both alike.
	for _, c := range []struct {
		name    string
		s       *testworld.Stack
		queries *atomic.Int64
	}{{"tokenguard-plain", plain, pq}, {"tokenguard-metrics", observed, oq}} {
		b.Run(c.name, func(b *testing.B) {
			before := c.queries.Load()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := c.s.UC.Token(ctx, conn); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(c.queries.Load()-before)/float64(b.N), "queries/op")
		})
	}
}
