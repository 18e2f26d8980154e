// Package metrics exposes what the token layer does as Prometheus metrics:
// it implements usecase.Observer on its own registry (never the global
// default one) and serves it with promhttp.
//
// Labels never carry a secret and stay low-cardinality: outcome, trigger,
// result and status take a handful of fixed values. The connection name is
// a label only when Options.ConnectionLabel asks for it (small fleets).
package metrics

import (
	"context"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/usecase"
)

// StatusCounter counts connections by status; the repository is one.
type StatusCounter interface {
	CountByStatus(ctx context.Context) (map[domain.Status]int, error)
}

// Options configure Metrics. The zero value is usable.
type Options struct {
	// ConnectionLabel adds a "connection" label (the connection name) to
	// the refresh counters. Off by default: with many connections it makes
	// one series per connection and outcome.
	ConnectionLabel bool
	// StatusTimeout bounds the query of CountConnections at a scrape
	// (default 2s).
	StatusTimeout time.Duration
	// Log receives scrape errors (default slog.Default()).
	Log *slog.Logger
}

// Metrics is a usecase.Observer that records into its own registry. It is
// safe for concurrent use.
type Metrics struct {
	reg             *prometheus.Registry
	connectionLabel bool
	log             *slog.Logger
	statusTimeout   time.Duration

	refreshes       *prometheus.CounterVec
	forced          *prometheus.CounterVec
	lockWait        prometheus.Histogram
	providerLatency prometheus.Histogram
	invalidations   prometheus.Counter
	listener        prometheus.Gauge
	connects        *prometheus.CounterVec

	// The cache lookup is counted on every Token call, the hot path: see
	// stripedCounter. misses is the slow path and may share a line.
	lookups stripedCounter
	misses  atomic.Uint64
}

// Outcomes every refresh counter starts with at zero, so that rate() and
// alerts work before the first failure.
var outcomes = []usecase.RefreshOutcome{
	usecase.OutcomeOK, usecase.OutcomeSkippedFresh, usecase.OutcomeTransientError,
	usecase.OutcomeInvalidGrant, usecase.OutcomeClientRejected, usecase.OutcomeEndpointMisconfigured, usecase.OutcomeError,
}

// Refresh triggers (the "trigger" label).
const (
	TriggerExpiry       = "expiry"       // the token was due (or a sweep)
	TriggerUnauthorized = "unauthorized" // a caller's request was answered 401
)

// New builds the metrics and registers them, with the Go runtime and
// process collectors, on a fresh registry.
func New(o Options) *Metrics {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.StatusTimeout <= 0 {
		o.StatusTimeout = 2 * time.Second
	}
	m := &Metrics{reg: prometheus.NewRegistry(), connectionLabel: o.ConnectionLabel, log: o.Log, statusTimeout: o.StatusTimeout}
	refreshLabels, forcedLabels := []string{"outcome", "trigger"}, []string(nil)
	if o.ConnectionLabel {
		refreshLabels, forcedLabels = append(refreshLabels, "connection"), []string{"connection"}
	}
	m.refreshes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tokenguard_token_refreshes_total",
		Help: "Passes through a connection's refresh lock, by outcome: ok (refreshed and stored), skipped_fresh_after_lock (another process had refreshed), transient_error, invalid_grant (connection now needs_reauth), client_rejected (check OAUTH_CLIENT_ID, OAUTH_CLIENT_SECRET, OAUTH_AUTH_STYLE; connection untouched), endpoint_misconfigured (check OAUTH_TOKEN_URL; connection untouched), error (lock wait, store, context); and by trigger (expiry or unauthorized: forced after a 401).",
	}, refreshLabels)
	m.forced = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tokenguard_token_forced_refresh_requests_total",
		Help: "Callers whose request was answered 401 and who asked for a newer token. At most one refresh per failed version follows; the rest read the stored token.",
	}, forcedLabels)
	m.lockWait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "tokenguard_token_lock_wait_seconds",
		Help:    "Time from asking for a connection's refresh lock to holding it (or giving up).",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 15, 30},
	})
	m.providerLatency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "tokenguard_provider_refresh_duration_seconds",
		Help:    "Duration of the refresh_token grant at the provider, retries included, for every pass that called it.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	})
	m.invalidations = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tokenguard_token_invalidations_total",
		Help: "Token change notifications (LISTEN/NOTIFY) received from the database, this process's own writes included.",
	})
	m.listener = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tokenguard_token_listener_connected",
		Help: "1 while the change listener is connected and the in-process cache is trusted; 0 while every call reads the database.",
	})
	if !o.ConnectionLabel {
		for _, oc := range outcomes {
			for _, tr := range []string{TriggerExpiry, TriggerUnauthorized} {
				m.refreshes.WithLabelValues(string(oc), tr)
			}
		}
		m.forced.WithLabelValues()
	}
	m.connects = newConnectCounter()
	m.reg.MustRegister(m.refreshes, m.forced, m.lockWait, m.providerLatency, m.invalidations, m.listener, m.connects,
		cacheCollector{m}, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// CountConnections reports tokenguard_connections{status} from c, asked at
// every scrape. The figure is fleet-wide: every process reports the same
// number (aggregate with max, not sum). Call it once.
func (m *Metrics) CountConnections(c StatusCounter) {
	m.reg.MustRegister(statusCollector{counter: c, timeout: m.statusTimeout})
}

// Registry is where the metrics live; register more collectors on it.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus exposition format. A
// collector that fails (the database is down) is left out of that scrape
// and logged; the rest is still served.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(m.log.Handler(), slog.LevelWarn),
		ErrorHandling: promhttp.ContinueOnError,
		Registry:      m.reg, // promhttp_metric_handler_errors_total
	})
}

// CacheLookup implements usecase.Observer. It is on every Token call: one
// uncontended atomic add for a hit, two for a miss.
func (m *Metrics) CacheLookup(hit bool) {
	m.lookups.inc()
	if !hit {
		m.misses.Add(1)
	}
}

// Refreshed implements usecase.Observer.
func (m *Metrics) Refreshed(e usecase.RefreshEvent) {
	trigger := TriggerExpiry
	if e.Forced {
		trigger = TriggerUnauthorized
	}
	if m.connectionLabel {
		m.refreshes.WithLabelValues(string(e.Outcome), trigger, e.ConnectionID).Inc()
	} else {
		m.refreshes.WithLabelValues(string(e.Outcome), trigger).Inc()
	}
	m.lockWait.Observe(e.LockWait.Seconds())
	if e.ProviderLatency > 0 {
		m.providerLatency.Observe(e.ProviderLatency.Seconds())
	}
}

// ForcedRefresh implements usecase.Observer.
func (m *Metrics) ForcedRefresh(connectionID string) {
	if m.connectionLabel {
		m.forced.WithLabelValues(connectionID).Inc()
		return
	}
	m.forced.WithLabelValues().Inc()
}

// Invalidated implements usecase.Observer.
func (m *Metrics) Invalidated() { m.invalidations.Inc() }

// ListenerConnected records whether the change listener is connected (the
// cache is trusted).
func (m *Metrics) ListenerConnected(ok bool) {
	if ok {
		m.listener.Set(1)
	} else {
		m.listener.Set(0)
	}
}

var _ usecase.Observer = (*Metrics)(nil)

// stripedCounter is a counter for the hot path. A single atomic counter
// (a prometheus.Counter is one) is a cache line that every core writes on
// every call; under parallel load that line bounces between cores and
// slows the lock-free cache reads around it. Here each add goes to one of
// several stripes, chosen by the address of the calling goroutine's stack,
// so a goroutine keeps to its stripe and concurrent goroutines rarely
// share one; a scrape sums the stripes. (A stack that grows moves, and
// its goroutine then just counts on another stripe.)
type stripedCounter struct {
	stripes [stripes]paddedCounter
}

const stripes = 32

// paddedCounter keeps every counter 128 bytes from the next whatever the
// struct's alignment, so no two share a cache line (or an adjacent-line
// prefetch pair).
type paddedCounter struct {
	_ [64]byte
	n atomic.Uint64
	_ [56]byte
}

func (c *stripedCounter) inc() {
	var anchor byte
	// Goroutine stacks are at least 8 KiB apart; the bits above that
	// pick the stripe. The pointer is only read as a number.
	c.stripes[(uintptr(unsafe.Pointer(&anchor))>>13)%stripes].n.Add(1)
}

func (c *stripedCounter) load() uint64 {
	var n uint64
	for i := range c.stripes {
		n += c.stripes[i].n.Load()
	}
	return n
}

var cacheDesc = prometheus.NewDesc("tokenguard_token_cache_lookups_total",
	"Token calls by whether the in-process cache served them (hit: no query, no lock) or not (miss: read the database, maybe refresh).",
	[]string{"result"}, nil)

// cacheCollector derives hits as lookups minus misses at scrape time. Both
// only grow; misses is read first, so hits never goes negative nor back.
type cacheCollector struct{ m *Metrics }

func (c cacheCollector) Describe(ch chan<- *prometheus.Desc) { ch <- cacheDesc }

func (c cacheCollector) Collect(ch chan<- prometheus.Metric) {
	misses := c.m.misses.Load()
	lookups := c.m.lookups.load()
	hits := uint64(0)
	if lookups > misses {
		hits = lookups - misses
	}
	ch <- prometheus.MustNewConstMetric(cacheDesc, prometheus.CounterValue, float64(hits), "hit")
	ch <- prometheus.MustNewConstMetric(cacheDesc, prometheus.CounterValue, float64(misses), "miss")
}

var statusDesc = prometheus.NewDesc("tokenguard_connections",
	"Connections with a stored token, by status (active, needs_reauth), read from the database at scrape time. Fleet-wide: every process reports the same figure.",
	[]string{"status"}, nil)

type statusCollector struct {
	counter StatusCounter
	timeout time.Duration
}

func (c statusCollector) Describe(ch chan<- *prometheus.Desc) { ch <- statusDesc }

func (c statusCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	counts, err := c.counter.CountByStatus(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(statusDesc, err)
		return
	}
	for _, s := range []domain.Status{domain.StatusActive, domain.StatusNeedsReauth} {
		ch <- prometheus.MustNewConstMetric(statusDesc, prometheus.GaugeValue, float64(counts[s]), string(s))
	}
	for s, n := range counts {
		if s != domain.StatusActive && s != domain.StatusNeedsReauth {
			ch <- prometheus.MustNewConstMetric(statusDesc, prometheus.GaugeValue, float64(n), string(s))
		}
	}
}
