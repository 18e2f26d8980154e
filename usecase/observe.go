package usecase

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// Observer is told what the use case does, for metrics; on hot paths: cheap and concurrency-safe.
type Observer interface {
	// CacheLookup: a Token call was served from the cache (hit) or not.
	CacheLookup(hit bool)
	// Refreshed: one pass through a connection's lock ended.
	Refreshed(e RefreshEvent)
	// ForcedRefresh: a caller whose token was rejected (401) asked for another.
	ForcedRefresh(connection string)
	// Invalidated: another process announced a new version.
	Invalidated()
}

// RefreshOutcome says how a pass through the lock ended.
type RefreshOutcome string

// Outcomes; labels of the refresh metrics.
const (
	OutcomeOK             RefreshOutcome = "ok"                       // refreshed and stored
	OutcomeSkippedFresh   RefreshOutcome = "skipped_fresh_after_lock" // someone else had refreshed
	OutcomeTransientError RefreshOutcome = "transient_error"          // provider unavailable; token untouched
	OutcomeInvalidGrant   RefreshOutcome = "invalid_grant"            // grant rejected; connection needs_reauth
	// The provider rejected the client (or, pausing after that, was not called); token untouched.
	OutcomeClientRejected RefreshOutcome = "client_rejected"
	// The token URL is not a token endpoint; connection and token untouched.
	OutcomeEndpointMisconfigured RefreshOutcome = "endpoint_misconfigured"
	OutcomeError                 RefreshOutcome = "error" // lock wait, store or context
	// The provider's answer could not be classified (or was lost): the connection backs off.
	OutcomeUnclassified RefreshOutcome = "unclassified_answer"
	// The provider was not called: the connection's failing refreshes back off (or may not again).
	OutcomeBackoff RefreshOutcome = "backoff"
)

// outcome names how a pass that did not store a dead grant ended.
func outcome(err error) RefreshOutcome {
	switch _, isPaced := paced(err); {
	case isPaced:
		return OutcomeUnclassified
	case err == nil:
		return OutcomeOK
	case errors.Is(err, domain.ErrRefreshFailing):
		return OutcomeBackoff
	case errors.Is(err, domain.ErrClientRejected):
		return OutcomeClientRejected
	case errors.Is(err, domain.ErrEndpointMisconfigured):
		return OutcomeEndpointMisconfigured
	case errors.Is(err, domain.ErrProviderUnavailable):
		return OutcomeTransientError
	}
	return OutcomeError
}

// RefreshEvent describes one pass through a connection's lock. It carries no secret.
type RefreshEvent struct {
	Connection      string
	Provider        string // the connection's provider as read under the lock; "" the environment's (or not read)
	Outcome         RefreshOutcome
	Forced          bool  // after a 401
	OldVersion      int64 // version found inside the lock (0 if not read)
	NewVersion      int64 // version stored (0 if none)
	LockWait        time.Duration
	ProviderLatency time.Duration // 0 when the provider was not called
	Err             error
}

type noObserver struct{}

func (noObserver) CacheLookup(bool)       {}
func (noObserver) Refreshed(RefreshEvent) {}
func (noObserver) ForcedRefresh(string)   {}
func (noObserver) Invalidated()           {}

// observe logs the pass (one line a provider call: what operators follow) and reports it to the Observer.
func (u *RefreshTokenUseCase) observe(e RefreshEvent) {
	level := slog.LevelInfo
	switch {
	case e.Outcome == OutcomeSkippedFresh, e.Outcome == OutcomeBackoff,
		e.ProviderLatency == 0 && (e.Outcome == OutcomeClientRejected || e.Outcome == OutcomeEndpointMisconfigured):
		// No provider call: fresh, a backoff (its episode was logged when recorded), or the client gate paused it.
		level = slog.LevelDebug
	case e.Err != nil:
		level = slog.LevelWarn
	}
	attrs := []slog.Attr{
		slog.String("connection", e.Connection), slog.String("outcome", string(e.Outcome)),
		slog.Int64("old_version", e.OldVersion), slog.Int64("new_version", e.NewVersion),
		slog.Float64("lock_wait_ms", float64(e.LockWait.Microseconds())/1000),
		slog.Float64("provider_ms", float64(e.ProviderLatency.Microseconds())/1000), slog.Bool("forced", e.Forced),
	}
	if e.Err != nil {
		attrs = append(attrs, slog.String("err", e.Err.Error()))
	}
	u.opts.Logger.LogAttrs(context.Background(), level, "token refresh", attrs...)
	u.opts.Observer.Refreshed(e)
	// A grant rejected at a version behind one this process knew: the database went back in time.
	// Only this outcome is checked after the lock: no other process can commit one before it.
	if e.Outcome == OutcomeInvalidGrant && e.OldVersion > 0 {
		u.cache.read(e.Connection, e.OldVersion, everything, true)
	}
	if e.NewVersion > 0 {
		u.cache.knew(e.Connection, e.NewVersion, false)
	}
}

// Tracer records the slow path of a token as spans (a cache hit records none); safe for concurrent use.
type Tracer interface {
	// Start opens step's span for connection ("" for none) under ctx's span.
	Start(ctx context.Context, step Step, connection string) (context.Context, Span)
}

// Span is a step in progress.
type Span interface {
	// End closes the span; Facts hold no secret, a non-nil err marks it failed.
	End(f Facts, err error)
}

// Step names a span.
type Step string

// The steps of the slow path.
const (
	StepToken    Step = "tokenguard.token"         // a Token or ForceRefresh call the cache did not answer
	StepRefresh  Step = "tokenguard.refresh"       // one pass through the connection's lock (a RefreshEvent)
	StepLockWait Step = "tokenguard.lock_wait"     // until the connection's lock is held, another process's lease waited out
	StepReread   Step = "tokenguard.reread"        // the token read again under the lock
	StepLease    Step = "tokenguard.lease"         // the refresh lease written and committed
	StepProvider Step = "tokenguard.provider_call" // the token endpoint, retries included
	StepCommit   Step = "tokenguard.commit"        // the provider's answer written under the lock and committed
	StepRescue   Step = "tokenguard.rescue"        // the write of a rotated token retried after it failed
	StepSweep    Step = "tokenguard.sweep"         // a round of RefreshAhead or KeepAlive
)

// Facts are what a step learned. Zero fields were not learned.
type Facts struct {
	Provider   string // "" is the process's own (or not read)
	Outcome    RefreshOutcome
	OldVersion int64 // the version found
	NewVersion int64 // the version stored, or handed out
	Waited     bool  // the step waited for another holder's lease
	Forced     bool  // after a 401
	Sweep      AheadReport
	SweepKind  string // "refresh_ahead" or "keep_alive"
}

type noTracer struct{}

func (noTracer) Start(ctx context.Context, _ Step, _ string) (context.Context, Span) {
	return ctx, noSpan{}
}

type noSpan struct{}

func (noSpan) End(Facts, error) {}

// facts are the refresh span's: the pass's event.
func (e RefreshEvent) facts(waited bool) Facts {
	return Facts{Provider: e.Provider, Outcome: e.Outcome, OldVersion: e.OldVersion, NewVersion: e.NewVersion,
		Waited: waited, Forced: e.Forced}
}
