package usecase

import "context"

// Tracer records the slow path of a token as spans (a cache hit records
// nothing). Its methods must be safe for concurrent use.
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
