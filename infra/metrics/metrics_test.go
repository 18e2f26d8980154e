package metrics_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/metrics"
	"github.com/tokenguard/tokenguard/usecase"
)

// scrape GETs /metrics from h as Prometheus would and parses the answer.
func scrape(t testing.TB, h http.Handler) (map[string]*dto.MetricFamily, string) {
	t.Helper()
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s\n%s", resp.Status, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, body)
	}
	return fams, string(body)
}

// value sums the samples of family name whose labels include want
// (counter, gauge or histogram sample count). -1: no such family.
func value(fams map[string]*dto.MetricFamily, name string, want ...string) float64 {
	f, ok := fams[name]
	if !ok {
		return -1
	}
	var sum float64
next:
	for _, m := range f.GetMetric() {
		for i := 0; i+1 < len(want); i += 2 {
			found := false
			for _, l := range m.GetLabel() {
				if l.GetName() == want[i] && l.GetValue() == want[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		}
	}
	return sum
}

// newMetrics is New on a fresh NewRegistry, and the handler serving that registry at /metrics.
func newMetrics(o metrics.Options) (*metrics.Metrics, http.Handler) {
	reg := metrics.NewRegistry()
	o.Registerer = reg
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics.HandlerFor(reg, slog.New(slog.DiscardHandler)))
	return metrics.New(o), mux
}

func TestObserverEventsBecomeMetrics(t *testing.T) {
	m, route := newMetrics(metrics.Options{})
	for range 5 {
		m.CacheLookup(true)
	}
	m.CacheLookup(false)
	m.CacheLookup(false)
	m.Refreshed(usecase.RefreshEvent{Connection: "acme", Outcome: usecase.OutcomeOK, LockWait: 3 * time.Millisecond, ProviderLatency: 40 * time.Millisecond})
	m.Refreshed(usecase.RefreshEvent{Connection: "acme", Outcome: usecase.OutcomeSkippedFresh, LockWait: 45 * time.Millisecond})
	m.Refreshed(usecase.RefreshEvent{Connection: "acme", Outcome: usecase.OutcomeOK, Forced: true, LockWait: time.Millisecond, ProviderLatency: 30 * time.Millisecond})
	m.Refreshed(usecase.RefreshEvent{Connection: "globex", Outcome: usecase.OutcomeInvalidGrant, LockWait: time.Millisecond, ProviderLatency: 20 * time.Millisecond, Err: errors.New("x")})
	m.ForcedRefresh("acme")
	m.Invalidated()
	m.Invalidated()
	m.ListenerConnected(true)
	m.ReplicationSync(true)
	m.VersionRegressed()
	m.VersionRegressed()

	fams, body := scrape(t, route)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"tokenguard_token_cache_lookups_total", []string{"result", "hit"}, 5},
		{"tokenguard_token_cache_lookups_total", []string{"result", "miss"}, 2},
		{"tokenguard_token_refreshes_total", []string{"outcome", "ok", "trigger", "expiry"}, 1},
		{"tokenguard_token_refreshes_total", []string{"outcome", "ok", "trigger", "unauthorized"}, 1},
		{"tokenguard_token_refreshes_total", []string{"outcome", "skipped_fresh_after_lock"}, 1},
		{"tokenguard_token_refreshes_total", []string{"outcome", "invalid_grant"}, 1},
		{"tokenguard_token_refreshes_total", []string{"outcome", "transient_error"}, 0},
		{"tokenguard_token_refreshes_total", nil, 4},
		{"tokenguard_token_forced_refresh_requests_total", nil, 1},
		{"tokenguard_token_lock_wait_seconds", nil, 4},
		{"tokenguard_provider_refresh_duration_seconds", nil, 3}, // the skipped pass called nobody
		{"tokenguard_token_invalidations_total", nil, 2},
		{"tokenguard_token_listener_connected", nil, 1},
		{"tokenguard_replication_sync", nil, 1},
		{"tokenguard_token_version_regressions_total", nil, 2},
	} {
		if got := value(fams, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	// 20 ms is in the 25 ms bucket, 30 and 40 ms are not.
	h := fams["tokenguard_provider_refresh_duration_seconds"].GetMetric()[0].GetHistogram()
	for _, b := range h.GetBucket() {
		if b.GetUpperBound() == 0.025 && b.GetCumulativeCount() != 1 {
			t.Errorf("provider latency <= 25ms: %d, want 1", b.GetCumulativeCount())
		}
	}
	if strings.Contains(body, "acme") || strings.Contains(body, "connection=") {
		t.Errorf("connection names are labels without ConnectionLabel:\n%s", body)
	}
	if value(fams, "go_goroutines") <= 0 {
		t.Error("no Go runtime metrics")
	}
}

func TestConnectionLabelIsOptIn(t *testing.T) {
	m, route := newMetrics(metrics.Options{ConnectionLabel: true})
	m.Refreshed(usecase.RefreshEvent{Connection: "acme", Outcome: usecase.OutcomeOK, ProviderLatency: time.Millisecond})
	m.Refreshed(usecase.RefreshEvent{Connection: "globex", Outcome: usecase.OutcomeTransientError, ProviderLatency: time.Millisecond})
	m.ForcedRefresh("globex")
	fams, _ := scrape(t, route)
	if got := value(fams, "tokenguard_token_refreshes_total", "connection", "acme", "outcome", "ok"); got != 1 {
		t.Errorf("refreshes{connection=acme,outcome=ok} = %v", got)
	}
	if got := value(fams, "tokenguard_token_refreshes_total", "connection", "globex", "outcome", "transient_error"); got != 1 {
		t.Errorf("refreshes{connection=globex,outcome=transient_error} = %v", got)
	}
	if got := value(fams, "tokenguard_token_forced_refresh_requests_total", "connection", "globex"); got != 1 {
		t.Errorf("forced{connection=globex} = %v", got)
	}
}

type statuses struct {
	counts map[domain.Status]int
	err    error
	calls  atomic.Int64
}

func (s *statuses) CountByStatus(ctx context.Context) (map[domain.Status]int, error) {
	s.calls.Add(1)
	if _, ok := ctx.Deadline(); !ok {
		return nil, errors.New("no deadline")
	}
	return s.counts, s.err
}

func TestConnectionsByStatusAtScrapeTime(t *testing.T) {
	m, route := newMetrics(metrics.Options{})
	st := &statuses{counts: map[domain.Status]int{domain.StatusActive: 7}}
	m.CountConnections(st)
	fams, _ := scrape(t, route)
	if a, n := value(fams, "tokenguard_connections", "status", "active"), value(fams, "tokenguard_connections", "status", "needs_reauth"); a != 7 || n != 0 {
		t.Errorf("connections active=%v needs_reauth=%v, want 7 and 0", a, n)
	}
	st.counts = map[domain.Status]int{domain.StatusActive: 6, domain.StatusNeedsReauth: 1}
	fams, _ = scrape(t, route)
	if a, n := value(fams, "tokenguard_connections", "status", "active"), value(fams, "tokenguard_connections", "status", "needs_reauth"); a != 6 || n != 1 {
		t.Errorf("connections active=%v needs_reauth=%v, want 6 and 1", a, n)
	}
	if st.calls.Load() != 2 {
		t.Errorf("%d queries for 2 scrapes", st.calls.Load())
	}

	// The database is down: the rest is still served.
	st.err = errors.New("token store unavailable")
	m.Invalidated()
	fams, _ = scrape(t, route)
	if value(fams, "tokenguard_connections") != -1 || value(fams, "tokenguard_token_invalidations_total") != 1 {
		t.Errorf("with the store down: connections %v, invalidations %v", value(fams, "tokenguard_connections"), value(fams, "tokenguard_token_invalidations_total"))
	}
	fams, _ = scrape(t, route) // the failed scrape is counted after it was served
	if got := value(fams, "promhttp_metric_handler_errors_total", "cause", "gathering"); got != 1 {
		t.Errorf("gathering errors = %v, want 1", got)
	}
}

func TestCacheLookupDoesNotAllocate(t *testing.T) {
	m := metrics.New(metrics.Options{})
	if n := testing.AllocsPerRun(1000, func() { m.CacheLookup(true); m.CacheLookup(false) }); n != 0 {
		t.Errorf("CacheLookup allocates %v times", n)
	}
}

// BenchmarkCacheLookup compares ways of counting on the hot path under
// parallel load: the striped counter Metrics uses, one prometheus.Counter,
// and one atomic.
func BenchmarkCacheLookup(b *testing.B) {
	b.Run("striped", func(b *testing.B) {
		m := metrics.New(metrics.Options{})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				m.CacheLookup(true)
			}
		})
	})
	b.Run("prometheus-counter", func(b *testing.B) {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: "c"})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				c.Inc()
			}
		})
	})
	b.Run("one-atomic", func(b *testing.B) {
		var n atomic.Uint64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				n.Add(1)
			}
		})
	})
}
