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
	"github.com/tokenguard/tokenguard/internal/metricsof"
	"github.com/tokenguard/tokenguard/repository"
)

// WithMetrics registers tokenguard's Prometheus metrics on r: refreshes by
// outcome, lock waits, provider latency, cache hits and misses, whether
// the change listener (Run) is connected, connections by status.
// tokenguard.WithMetricsPerConnection adds a connection label. A nil r
// registers nothing.
func WithMetrics(r prometheus.Registerer) tokenguard.Option {
	var build metricsof.Build
	if r != nil {
		build = func(repo *repository.TokenRepository, perConnection bool, log *slog.Logger) metricsof.Metrics {
			m := metrics.New(metrics.Options{Registerer: r, ConnectionLabel: perConnection, Log: log})
			m.CountConnections(repo)
			return m
		}
	}
	return metricsof.Option(build).(tokenguard.Option)
}
