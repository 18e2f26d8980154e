// Package metricsof lets package prom give a *tokenguard.Tokens its
// Prometheus metrics without package tokenguard importing Prometheus: an
// application that never asks for metrics links no Prometheus client. The
// root package sets Option when it loads.
package metricsof

import (
	"log/slog"

	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// Metrics is what New hands the use case and the change listener.
type Metrics interface {
	usecase.Observer
	ListenerConnected(connected bool)
	// ReplicationSync: whether the primary has a synchronous standby.
	ReplicationSync(ok bool)
	// VersionRegressed counts a connection read at an older version than
	// this process knew (a failover or restore lost a write).
	VersionRegressed()
}

// Build makes the metrics of one *tokenguard.Tokens: repo counts its
// connections by status at each scrape.
type Build func(repo *repository.TokenRepository, perConnection bool, log *slog.Logger) Metrics

// Option returns the tokenguard.Option (as any: this package cannot name
// it) that builds the metrics with b; nil b: no metrics.
var Option func(b Build) any
