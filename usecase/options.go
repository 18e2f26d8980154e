package usecase

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Options tune RefreshTokenUseCase. Zero values take the defaults.
type Options struct {
	// Skew: a token is refreshed once it is within Skew of its expiry
	// (default 30s), capped at half the lifetime the provider granted.
	Skew time.Duration
	// LockWait bounds the wait for another process's refresh (default 15s).
	LockWait time.Duration
	// RefreshTimeout bounds one provider call (default 10s). It must be
	// shorter than LockWait, so that a process waiting behind a refresh
	// outlasts it and then finds the new token instead of timing out.
	RefreshTimeout time.Duration
	// AnswerDeadline bounds how long the answer to a request that
	// presented a refresh token is awaited (default 2m), independent of
	// callers, who stop waiting after RefreshTimeout. Until the answer is
	// in, or the deadline passes, no process presents that refresh token
	// again: a hung provider answers its queue when it resumes, and a
	// strict one takes a second presentation for a reuse. At least
	// RefreshTimeout.
	AnswerDeadline time.Duration
	// WriteTimeout bounds persisting the rotated token after the provider
	// answered (default 5s).
	WriteTimeout time.Duration
	// Clock defaults to the system clock.
	Clock Clock
	// Logger receives what operators must know (never a token); default
	// slog.Default().
	Logger *slog.Logger
	// OnNeedsReauth is called once, by the process that found out, when a
	// connection's grant is rejected for good.
	OnNeedsReauth func(connection, reason string)
	// ForceInterval is the least time between two forced refreshes of one
	// connection by this process (default 5s), so an API that answers 401
	// to everything cannot drive a refresh loop. A token the provider
	// granted for less than twice that may be replaced after half its
	// lifetime instead.
	ForceInterval time.Duration
	// RescueWindow bounds how long a rotated token whose first write failed
	// is retried (default 30s). See refresh.
	RescueWindow time.Duration
	// Observer receives events for metrics; default none.
	Observer Observer
	// Tracer records the slow path as spans (a cache hit records none);
	// default none.
	Tracer Tracer
	// CacheSize bounds how many connections this process keeps a token of
	// (default DefaultCacheSize); negative means no bound. The least
	// recently hit are dropped first and read again when asked for.
	CacheSize int
	// ProviderSkew is the skew of a stored provider's connections, 0 for
	// Skew; nil: Skew for every connection. It is asked when a token is
	// read or cached, never on a cache hit.
	ProviderSkew func(provider string) time.Duration
	// MaxRefreshesInFlight bounds how many refreshes this process runs at
	// once (default DefaultMaxRefreshesInFlight): a mass expiry neither
	// floods the provider nor the database. Callers beyond it queue in
	// order of arrival; the queue does not count against LockWait.
	MaxRefreshesInFlight int
	// ProviderKeepAlives are the stored providers' own keep-alive
	// intervals, by name; they override KeepAlive's idle for their
	// connections. nil: none has one.
	ProviderKeepAlives func() map[string]time.Duration
}

// Defaults.
const (
	DefaultSkew           = 30 * time.Second
	DefaultLockWait       = 15 * time.Second
	DefaultRefreshTimeout = 10 * time.Second
	DefaultAnswerDeadline = 2 * time.Minute
	DefaultWriteTimeout   = 5 * time.Second
	DefaultForceInterval  = 5 * time.Second
	DefaultRescueWindow   = 30 * time.Second
	// DefaultCacheSize: at about 0.5 KB a connection, 5 MB a process, and
	// more connections than most deployments have; a larger fleet's
	// processes keep their working sets and read the rest through.
	DefaultCacheSize = 10_000
	// DefaultMaxRefreshesInFlight: a second's worth of refreshes of a
	// large fleet at a provider answering in a second, far more than any
	// pool has connections (a refresh holds none while the provider
	// answers).
	DefaultMaxRefreshesInFlight = 64
)

func (o Options) withDefaults() (Options, error) {
	o.Skew = cmp.Or(o.Skew, DefaultSkew)
	o.LockWait = cmp.Or(o.LockWait, DefaultLockWait)
	o.RefreshTimeout = cmp.Or(o.RefreshTimeout, min(DefaultRefreshTimeout, o.LockWait*2/3))
	o.AnswerDeadline = cmp.Or(o.AnswerDeadline, max(DefaultAnswerDeadline, o.RefreshTimeout))
	o.WriteTimeout = cmp.Or(o.WriteTimeout, DefaultWriteTimeout)
	o.Clock = cmp.Or[Clock](o.Clock, systemClock{})
	o.Logger = cmp.Or(o.Logger, slog.Default())
	if o.OnNeedsReauth == nil {
		o.OnNeedsReauth = func(string, string) {}
	}
	o.ForceInterval = cmp.Or(o.ForceInterval, DefaultForceInterval)
	o.Observer = cmp.Or[Observer](o.Observer, noObserver{})
	o.Tracer = cmp.Or[Tracer](o.Tracer, noTracer{})
	o.RescueWindow = cmp.Or(o.RescueWindow, DefaultRescueWindow)
	o.CacheSize = cmp.Or(o.CacheSize, DefaultCacheSize)
	o.MaxRefreshesInFlight = cmp.Or(o.MaxRefreshesInFlight, DefaultMaxRefreshesInFlight)
	switch {
	case o.Skew < 0:
		return o, fmt.Errorf("usecase: skew %v is negative", o.Skew)
	case o.LockWait < 0 || o.RefreshTimeout < 0 || o.WriteTimeout < 0:
		return o, errors.New("usecase: timeouts must be positive")
	case o.MaxRefreshesInFlight < 0:
		return o, fmt.Errorf("usecase: max refreshes in flight %d is negative", o.MaxRefreshesInFlight)
	case o.AnswerDeadline < o.RefreshTimeout:
		return o, fmt.Errorf("usecase: answer deadline %v must not be shorter than refresh timeout %v", o.AnswerDeadline, o.RefreshTimeout)
	case o.RefreshTimeout >= o.LockWait:
		return o, fmt.Errorf("usecase: refresh timeout %v must be shorter than lock wait %v", o.RefreshTimeout, o.LockWait)
	}
	return o, nil
}
