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
	// Skew: a token is refreshed within Skew of its expiry (default 30s), capped at half its lifetime.
	Skew     time.Duration
	LockWait time.Duration // bounds the wait for another process's refresh (default 15s)
	// RefreshTimeout bounds how long callers wait for a provider call (default 10s); shorter than
	// LockWait, so a process waiting behind a refresh outlasts it.
	RefreshTimeout time.Duration
	// AnswerDeadline bounds the wait for the answer to each request that presented a refresh
	// token, independent of callers (default 2m, at least RefreshTimeout); until then no process
	// presents it again. A refresh's retries start within RefreshTimeout (the refresher's policy),
	// so its call to the provider lasts up to both (callWindow).
	AnswerDeadline time.Duration
	WriteTimeout   time.Duration // bounds persisting the provider's answer (default 5s)
	Clock          Clock         // default: the system clock
	Logger         *slog.Logger  // what operators must know, never a token (default slog.Default())
	// OnNeedsReauth is called once, by the process that found out, when a grant is rejected for good.
	OnNeedsReauth func(connection, reason string)
	// ForceInterval is the least time between two forced refreshes of one connection here (default
	// 5s, or half a shorter token's lifetime): an API answering 401 to all drives no refresh loop.
	ForceInterval time.Duration
	RescueWindow  time.Duration // bounds retrying a rotated token's failed write (default 30s)
	Observer      Observer      // receives events for metrics; default none
	Tracer        Tracer        // records the slow path as spans; default none
	// CacheSize bounds the connections this process caches a token of (default DefaultCacheSize; < 0: no bound).
	CacheSize int
	// ProviderSkew is a stored provider's skew, 0 for Skew; nil: Skew for all. Not asked on a cache hit.
	ProviderSkew func(provider string) time.Duration
	// MaxRefreshesInFlight bounds this process's concurrent refreshes (default
	// DefaultMaxRefreshesInFlight); the queue beyond it does not count against LockWait.
	MaxRefreshesInFlight int
	// ProviderKeepAlives are stored providers' own keep-alive intervals, overriding KeepAlive's idle; nil: none.
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
	// DefaultCacheSize: at about 0.5 KB a connection, 5 MB a process.
	DefaultCacheSize = 10_000
	// DefaultMaxRefreshesInFlight: more than any pool has connections (none held while the provider answers).
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

// callWindow bounds a refresh's call to the provider, retries included, and the lease that covers it:
// a retry started within the refresh timeout is awaited for the whole answer deadline.
func (o Options) callWindow() time.Duration { return o.RefreshTimeout + o.AnswerDeadline }
