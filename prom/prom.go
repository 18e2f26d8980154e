// Package prom gives tokenguard Prometheus metrics. It is apart from
// package tokenguard so that an application without metrics links no
// Prometheus client.
//
//	tokens, err := tokenguard.New(db, cfg, prom.WithMetrics(prometheus.DefaultRegisterer))
package prom

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenguard/tokenguard"
	"github.com/tokenguard/tokenguard/infra/metrics"
)

// WithMetrics registers tokenguard's Prometheus metrics on r: refreshes by
// outcome, lock waits, provider latency, cache hits and misses, whether
// the change listener (Run) is connected, connections by status.
// tokenguard.WithMetricsPerConnection adds a connection label. A nil r
// registers nothing.
func WithMetrics(r prometheus.Registerer) tokenguard.Option {
	if r == nil {
		return tokenguard.WithMetricsOf(nil)
	}
	return tokenguard.WithMetricsOf(func(c tokenguard.ConnectionCounter, perConnection bool, _ *slog.Logger) tokenguard.Metrics {
		m := metrics.New(metrics.Options{Registerer: r, ConnectionLabel: perConnection})
		m.CountConnections(c)
		return m
	})
}
