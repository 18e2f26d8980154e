package usecase

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/tokenguard/tokenguard/domain"
)

// AheadStore is what refreshing ahead of expiry and keeping idle grants
// alive need from the store.
type AheadStore interface {
	// ExpiringBefore lists up to limit active connections whose token
	// expires before t, soonest first, from the cursor after ("" first);
	// next is the following page's cursor, "" after the last page.
	ExpiringBefore(ctx context.Context, t time.Time, after string, limit int) (names []string, next string, err error)
	// ObtainedBefore is ExpiringBefore for the connections whose token
	// was obtained before t, oldest first.
	ObtainedBefore(ctx context.Context, t time.Time, after string, limit int) (names []string, next string, err error)
	// TryInLock runs fn like TokenStore.InLock if the connection's lock is
	// free right now, and reports false without waiting if it is not.
	TryInLock(ctx context.Context, connection string, hold time.Duration,
		fn func(ctx context.Context, s LockedStore) error) (bool, error)
	// InLock is TokenStore.InLock: it stores what a refresh of the sweep
	// brought.
	InLock(ctx context.Context, connection string, wait, hold time.Duration,
		fn func(ctx context.Context, s LockedStore) error) error
	SaveLocked(ctx context.Context, wait time.Duration, t domain.Token) (domain.Token, error)
}

// AheadReport counts what one sweep (RefreshAhead or KeepAlive) did.
type AheadReport struct {
	Due       int // connections listed
	Refreshed int
	Skipped   int // another process held the lock: it is refreshing them
	Fresh     int // already refreshed by someone else by the time we looked
	Failed    int
}

// sweepPage is how many connections a sweep lists per query: a sweep
// holds at most one page and the connections in flight, however many are
// due.
const sweepPage = 500

// sweepErrors is how many single-connection errors a sweep returns; the
// rest are only counted in AheadReport.Failed.
const sweepErrors = 20

// lister lists one page of a sweep's connections (AheadStore's methods).
type lister func(ctx context.Context, t time.Time, after string, limit int) ([]string, string, error)

// RefreshAhead refreshes every connection whose token expires within
// window, at most concurrency at a time, so that callers rarely meet a
// stale token. Connections another process is refreshing right now are
// skipped rather than queued behind. Errors of single connections are
// counted, and the first few joined into the returned error; the pass goes
// on. It pages through the due connections (keyset pagination on an index
// on expiry), so its memory does not grow with the table.
func (u *RefreshTokenUseCase) RefreshAhead(ctx context.Context, store AheadStore, window time.Duration, concurrency int) (AheadReport, error) {
	deadline := u.opts.Clock.Now().Add(window)
	rep, err := u.sweep(ctx, "refresh_ahead", store, store.ExpiringBefore, deadline, concurrency, func(t domain.Token) bool {
		return !t.Expiry.IsZero() && t.Expiry.Before(deadline)
	})
	if err != nil {
		err = fmt.Errorf("refresh ahead: %w", err)
	}
	return rep, err
}

// KeepAlive refreshes every connection whose token was not refreshed for
// idle, like RefreshAhead: some providers let a refresh token die when it
// is not used for a while (30, 90, 100 days), even though its grant stands.
// A stored provider's own keep-alive (Options.ProviderKeepAlives) replaces
// idle for its connections; idle 0 keeps alive only those.
func (u *RefreshTokenUseCase) KeepAlive(ctx context.Context, store AheadStore, idle time.Duration, concurrency int) (AheadReport, error) {
	var own map[string]time.Duration
	if u.opts.ProviderKeepAlives != nil {
		own = u.opts.ProviderKeepAlives()
	}
	shortest := idle
	for _, d := range own {
		if shortest <= 0 || d < shortest {
			shortest = d
		}
	}
	if shortest <= 0 {
		return AheadReport{}, nil
	}
	now := u.opts.Clock.Now()
	rep, err := u.sweep(ctx, "keep_alive", store, store.ObtainedBefore, now.Add(-shortest), concurrency, func(t domain.Token) bool {
		d := idle
		if o, ok := own[t.Provider]; ok {
			d = o
		}
		return d > 0 && t.ObtainedAt.Before(now.Add(-d))
	})
	if err != nil {
		err = fmt.Errorf("keep alive: %w", err)
	}
	return rep, err
}

// sweep refreshes the connections list names, page by page, whose token,
// read under the lock, is active and due, at most concurrency at a time,
// skipping those whose lock is taken. kind names the sweep in its span.
func (u *RefreshTokenUseCase) sweep(ctx context.Context, kind string, store AheadStore, list lister, t time.Time, concurrency int, due func(domain.Token) bool) (_ AheadReport, err error) {
	ctx, span := u.opts.Tracer.Start(ctx, StepSweep, "")
	var rep AheadReport
	defer func() { span.End(Facts{Sweep: rep, SweepKind: kind}, err) }()
	var (
		refreshed, skipped, fresh, failed atomic.Int64
		mu                                sync.Mutex
		errs                              []error
		listed                            int
		listErr                           error
	)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(concurrency, 1))
	for after := ""; ; {
		ids, next, err := list(ctx, t, after, sweepPage)
		if err != nil {
			listErr = err
			break
		}
		listed += len(ids)
		for _, id := range ids {
			g.Go(func() error {
				switch outcome, err := u.sweepOne(gctx, store, id, due); outcome {
				case sweepFailed:
					failed.Add(1)
					mu.Lock()
					if len(errs) < sweepErrors {
						errs = append(errs, fmt.Errorf("%s: %w", id, err))
					}
					mu.Unlock()
				case sweepSkipped:
					skipped.Add(1)
				case sweepRefreshed:
					refreshed.Add(1)
				default:
					fresh.Add(1)
				}
				return nil
			})
		}
		if next == "" {
			break
		}
		after = next
	}
	_ = g.Wait()
	rep = AheadReport{Due: listed, Refreshed: int(refreshed.Load()), Skipped: int(skipped.Load()), Fresh: int(fresh.Load()), Failed: int(failed.Load())}
	if n := rep.Failed - len(errs); n > 0 {
		errs = append(errs, fmt.Errorf("and %d more connection(s) failed", n))
	}
	return rep, errors.Join(append([]error{listErr}, errs...)...)
}

type sweepOutcome int

const (
	sweepFresh sweepOutcome = iota
	sweepRefreshed
	sweepSkipped
	sweepFailed
)

// sweepOne refreshes one connection if its lock is free and its token,
// read under the lock, is active and due, holding one of the process's
// in-flight slots while it does.
func (u *RefreshTokenUseCase) sweepOne(ctx context.Context, store AheadStore, id string, due func(domain.Token) bool) (sweepOutcome, error) {
	if err := u.slots.Acquire(ctx, 1); err != nil {
		return sweepFailed, err
	}
	var (
		c      claimed
		r      redeemed
		called bool
		ev     RefreshEvent
		busy   bool // another process holds its lock or lease
	)
	ctx, span := u.opts.Tracer.Start(ctx, StepRefresh, id)
	defer func() { span.End(ev.facts(busy), ev.Err) }()
	locked, err := store.TryInLock(ctx, id, u.opts.WriteTimeout, func(txCtx context.Context, s LockedStore) error {
		t, err := u.reread(txCtx, s, id)
		if err != nil {
			return err
		}
		c.current = t
		if t.Status != domain.StatusActive || !due(t) {
			return nil // someone refreshed it since we listed it
		}
		called = true
		if err := u.gate.of(t.Provider).check(u.opts.Clock.Now()); err != nil {
			return err
		}
		if err := checkFailure(t, u.opts.Clock.Now()); err != nil {
			return err
		}
		c.end, err = u.lease(txCtx, s, t)
		return err
	})
	if c.end == nil {
		u.slots.Release(1)
	} else {
		c.release = sync.OnceFunc(func() { u.slots.Release(1) })
		r, err = u.redeem(ctx, store, c)
	}
	// The span's facts when nothing is observed: fresh, or skipped.
	ev = RefreshEvent{Connection: id, OldVersion: c.current.Version, Provider: c.current.Provider, Outcome: OutcomeSkippedFresh}
	if errors.Is(err, domain.ErrRefreshInProgress) {
		ev.Outcome, busy = "", true
		return sweepSkipped, nil // another process's refresh of it is not over
	}
	if !locked && err == nil {
		ev.Outcome, busy = "", true
	}
	if locked && (called || err != nil) {
		ev = RefreshEvent{Connection: id, OldVersion: c.current.Version, Provider: c.current.Provider,
			NewVersion: r.tok.Version, ProviderLatency: r.latency, Err: errors.Join(err, r.revoked), Outcome: outcome(err)}
		if r.revoked != nil {
			ev.Outcome = OutcomeInvalidGrant
			u.opts.OnNeedsReauth(id, r.reason)
		}
		u.observe(ev)
	}
	switch {
	case err != nil || r.revoked != nil:
		return sweepFailed, errors.Join(err, r.revoked)
	case !locked:
		return sweepSkipped, nil
	case called:
		return sweepRefreshed, nil
	}
	return sweepFresh, nil
}
