package tokenguard

import (
	"context"
	"log/slog"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/usecase"
)

// Metrics is what a Tokens reports as it works; prom.WithMetrics makes
// Prometheus metrics of it.
type Metrics interface {
	usecase.Observer
	ListenerConnected(connected bool)
	ReplicationSync(ok bool)
	VersionRegressed()
}

// ConnectionCounter counts connections by status, for a metrics scrape.
type ConnectionCounter interface {
	CountByStatus(ctx context.Context) (map[domain.Status]int, error)
}

// WithMetricsOf reports to the Metrics that build makes (package prom builds on
// it, keeping the Prometheus client out of applications without metrics).
func WithMetricsOf(build func(counter ConnectionCounter, perConnection bool, log *slog.Logger) Metrics) Option {
	return func(o *options) { o.metrics = build }
}
