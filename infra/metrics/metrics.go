// Package metrics exposes what the token layer does as Prometheus metrics,
// implementing usecase.Observer (never on the global default registry).
//
// Labels never carry a secret and stay low-cardinality: outcome, trigger, result and status take a
// handful of fixed values; provider is a stored provider's name or "default", at most
// MaxProviderLabels of them. The connection name is a label only with Options.ConnectionLabel.
package metrics

import (
	"cmp"
	"context"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/usecase"
)

// StatusCounter counts connections by status; the repository is one.
type StatusCounter interface {
	CountByStatus(ctx context.Context) (map[domain.Status]int, error)
}

// Options configure Metrics.
type Options struct {
	// ConnectionLabel adds a "connection" label to the refresh counters: a series per connection, for small fleets.
	ConnectionLabel bool
	// Registerer receives tokenguard's collectors only (an application's registry has its own
	// runtime collectors; NewRegistry adds them). Nil registers nothing, and CountConnections panics.
	Registerer prometheus.Registerer
}

// Metrics is a usecase.Observer. It is safe for concurrent use.
type Metrics struct {
	registerer      prometheus.Registerer
	connectionLabel bool

	refreshes       *prometheus.CounterVec
	forced          *prometheus.CounterVec
	lockWait        prometheus.Histogram
	providerLatency *prometheus.HistogramVec
	providersMu     sync.Mutex
	providers       map[string]bool // provider label values in use, at most MaxProviderLabels
	invalidations   prometheus.Counter
	listener        prometheus.Gauge
	replicationSync prometheus.Gauge
	regressions     prometheus.Counter

	// lookups is on the hot path (stripedCounter); misses is not.
	lookups stripedCounter
	misses  atomic.Uint64
}

// outcomes start every refresh counter at zero, so that rate() and alerts work before the first failure.
var outcomes = []usecase.RefreshOutcome{
	usecase.OutcomeOK, usecase.OutcomeSkippedFresh, usecase.OutcomeTransientError,
	usecase.OutcomeInvalidGrant, usecase.OutcomeClientRejected, usecase.OutcomeEndpointMisconfigured, usecase.OutcomeError,
	usecase.OutcomeUnclassified, usecase.OutcomeBackoff,
}

// Refresh triggers (the "trigger" label).
const (
	TriggerExpiry       = "expiry"       // the token was due (or a sweep)
	TriggerUnauthorized = "unauthorized" // a caller's request was answered 401
)

// New builds and registers the metrics on o.Registerer; it panics if already there.
func New(o Options) *Metrics {
	m := &Metrics{registerer: o.Registerer, connectionLabel: o.ConnectionLabel, providers: map[string]bool{}}
	f := promauto.With(m.registerer)
	m.refreshes = f.NewCounterVec(prometheus.CounterOpts{Name: "tokenguard_token_refreshes_total",
		Help: "Passes through a connection's refresh lock, by outcome: ok (refreshed and stored), skipped_fresh_after_lock (another process had refreshed), transient_error, invalid_grant (connection now needs_reauth), client_rejected (check OAUTH_CLIENT_ID, OAUTH_CLIENT_SECRET, OAUTH_AUTH_STYLE; connection untouched), endpoint_misconfigured (check OAUTH_TOKEN_URL; connection untouched), unclassified_answer (an answer tokenguard cannot classify, or a lost one whose refresh token may not be presented again: the connection backs off, see tokenguard_connections{status=\"failing\"}), backoff (not asked: the connection's failing refreshes are backing off), error (lock wait, store, context); by trigger (expiry or unauthorized: forced after a 401); and by provider (a stored provider's name, or default: the OAUTH_* one).",
	}, m.withConnection("connection", "outcome", "trigger", "provider"))
	m.forced = f.NewCounterVec(prometheus.CounterOpts{Name: "tokenguard_token_forced_refresh_requests_total",
		Help: "Callers whose request was answered 401 and who asked for a newer token. At most one refresh per failed version follows; the rest read the stored token.",
	}, m.withConnection("connection"))
	m.lockWait = f.NewHistogram(prometheus.HistogramOpts{Name: "tokenguard_token_lock_wait_seconds",
		Help:    "Time from asking for a connection's refresh lock to holding it (or giving up).",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 15, 30}})
	m.providerLatency = f.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "tokenguard_provider_refresh_duration_seconds",
		Help:    "Duration of the refresh_token grant at the provider, retries included, for every pass that called it, by provider.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}}, []string{"provider"})
	m.invalidations = f.NewCounter(prometheus.CounterOpts{Name: "tokenguard_token_invalidations_total",
		Help: "Token change notifications (LISTEN/NOTIFY) received from the database, this process's own writes included."})
	m.listener = f.NewGauge(prometheus.GaugeOpts{Name: "tokenguard_token_listener_connected",
		Help: "1 while the change listener is connected and the in-process cache is trusted; 0 while every call reads the database."})
	m.replicationSync = f.NewGauge(prometheus.GaugeOpts{Name: "tokenguard_replication_sync",
		Help: "1 while the database is a primary whose commits wait for a synchronous standby (a failover loses no committed token write); 0 otherwise. Read at start and at each reconnection of the change listener."})
	m.regressions = f.NewCounter(prometheus.CounterOpts{Name: "tokenguard_token_version_regressions_total",
		Help: "Connections this process found stored at an older version than one it knew committed: the database went back in time (a failover to an asynchronous standby, a restore). The stored refresh token is probably spent at the provider."})
	if !o.ConnectionLabel {
		for _, oc := range outcomes {
			for _, tr := range []string{TriggerExpiry, TriggerUnauthorized} {
				m.refreshes.WithLabelValues(string(oc), tr, DefaultProvider)
			}
		}
		m.forced.WithLabelValues()
	}
	// hits are lookups minus misses at scrape time. Both only grow; misses is read first, so hits
	// never goes negative nor back.
	for result, value := range map[string]func() uint64{
		"hit": func() uint64 {
			misses := m.misses.Load()
			return max(m.lookups.load(), misses) - misses
		},
		"miss": m.misses.Load,
	} {
		f.NewCounterFunc(prometheus.CounterOpts{Name: "tokenguard_token_cache_lookups_total",
			Help:        "Token calls by whether the in-process cache served them (hit: no query, no lock) or not (miss: read the database, maybe refresh).",
			ConstLabels: prometheus.Labels{"result": result}}, func() float64 { return float64(value()) })
	}
	return m
}

// CountConnections reports tokenguard_connections{status} from c at every
// scrape (fleet-wide: aggregate with max, not sum). Call it once.
func (m *Metrics) CountConnections(c StatusCounter) {
	m.registerer.MustRegister(statusCollector{c})
}

// HandlerFor serves reg; a failing collector (the database is down) is logged and left out of that scrape.
func HandlerFor(reg *prometheus.Registry, log *slog.Logger) http.Handler {
	log = cmp.Or(log, slog.Default())
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		ErrorHandling: promhttp.ContinueOnError,
		Registry:      reg, // promhttp_metric_handler_errors_total
	})
}

// NewRegistry is a registry with the Go runtime and process collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
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
	provider := m.providerLabel(e.Provider)
	m.refreshes.WithLabelValues(m.withConnection(e.Connection, string(e.Outcome), trigger, provider)...).Inc()
	m.lockWait.Observe(e.LockWait.Seconds())
	if e.ProviderLatency > 0 {
		m.providerLatency.WithLabelValues(provider).Observe(e.ProviderLatency.Seconds())
	}
}

// ForcedRefresh implements usecase.Observer.
func (m *Metrics) ForcedRefresh(connection string) {
	m.forced.WithLabelValues(m.withConnection(connection)...).Inc()
}

// withConnection is labels, then connection with Options.ConnectionLabel: the label names or values of the refresh counters.
func (m *Metrics) withConnection(connection string, labels ...string) []string {
	if m.connectionLabel {
		return append(labels, connection)
	}
	return labels
}

// Invalidated implements usecase.Observer.
func (m *Metrics) Invalidated() { m.invalidations.Inc() }

// ListenerConnected records whether the change listener is up (the cache is trusted).
func (m *Metrics) ListenerConnected(ok bool) { setBool(m.listener, ok) }

// ReplicationSync records whether the database's commits wait for a synchronous standby.
func (m *Metrics) ReplicationSync(ok bool) { setBool(m.replicationSync, ok) }

func setBool(g prometheus.Gauge, ok bool) {
	if ok {
		g.Set(1)
	} else {
		g.Set(0)
	}
}

// VersionRegressed counts a connection stored at an older version than one known committed.
func (m *Metrics) VersionRegressed() { m.regressions.Inc() }

var _ usecase.Observer = (*Metrics)(nil)

// stripedCounter is a hot-path counter: one atomic would bounce a cache line between cores on every
// call. Each add goes to a stripe picked by the caller's stack address; a scrape sums them.
type stripedCounter [stripes]paddedCounter

const stripes = 32

// paddedCounter keeps counters 128 bytes apart (no shared cache line pair).
type paddedCounter struct {
	_ [64]byte
	n atomic.Uint64
	_ [56]byte
}

func (c *stripedCounter) inc() {
	var anchor byte
	// Goroutine stacks are at least 8 KiB apart; the bits above pick it.
	c[(uintptr(unsafe.Pointer(&anchor))>>13)%stripes].n.Add(1)
}

func (c *stripedCounter) load() uint64 {
	var n uint64
	for i := range c {
		n += c[i].n.Load()
	}
	return n
}

var statusDesc = prometheus.NewDesc("tokenguard_connections",
	"Connections with a stored token, by status (active, failing: active but its refreshes keep failing, needs_reauth), read from the database at scrape time. Fleet-wide: every process reports the same figure.",
	[]string{"status"}, nil)

type statusCollector struct{ counter StatusCounter }

func (c statusCollector) Describe(ch chan<- *prometheus.Desc) { ch <- statusDesc }

func (c statusCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second) // bounds the scrape's query
	defer cancel()
	counts, err := c.counter.CountByStatus(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(statusDesc, err)
		return
	}
	all := map[domain.Status]int{domain.StatusActive: 0, domain.StatusFailing: 0, domain.StatusNeedsReauth: 0}
	maps.Copy(all, counts)
	for s, n := range all {
		ch <- prometheus.MustNewConstMetric(statusDesc, prometheus.GaugeValue, float64(n), string(s))
	}
}

const (
	// DefaultProvider labels the connections that name no stored provider.
	DefaultProvider = domain.ReservedProviderName
	// OtherProviders labels every provider past the first MaxProviderLabels seen.
	OtherProviders = "other"
	// MaxProviderLabels bounds the provider label's values per process; only a fleet
	// with that many registered providers reaches it.
	MaxProviderLabels = 100
)

func (m *Metrics) providerLabel(provider string) string {
	if provider == "" {
		return DefaultProvider
	}
	m.providersMu.Lock()
	defer m.providersMu.Unlock()
	if !m.providers[provider] && len(m.providers) >= MaxProviderLabels {
		return OtherProviders
	}
	m.providers[provider] = true
	return provider
}

// connectOutcomes are the values of tokenguard_connect_grants_total's
// outcome label; every other code of the connect flow counts as "failed".
var connectOutcomes = []string{"pending", "connected", "scopes_narrowed", "account_mismatch", "bad_state", "exchange_failed", "failed"}

// ConnectCounter counts the ends of the server's browser connect flow.
type ConnectCounter struct{ c *prometheus.CounterVec }

// NewConnectCounter registers the counter on reg.
func NewConnectCounter(reg prometheus.Registerer) *ConnectCounter {
	c := promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
		Name: "tokenguard_connect_grants_total",
		Help: "Steps of the connect flow by outcome: pending (a consent's grant waits for its redemption), connected (redeemed), scopes_narrowed (connected with fewer scopes than OAUTH_SCOPES), account_mismatch (refused: another provider account), bad_state, exchange_failed, failed (anything else, the provider's refusal included).",
	}, []string{"outcome"})
	for _, o := range connectOutcomes {
		c.WithLabelValues(o)
	}
	return &ConnectCounter{c}
}

// ConnectOutcome counts one end of the connect flow.
func (m *ConnectCounter) ConnectOutcome(code string) {
	if !slices.Contains(connectOutcomes, code) {
		code = "failed"
	}
	m.c.WithLabelValues(code).Inc()
}
