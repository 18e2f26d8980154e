package usecase

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/semaphore"

	"github.com/tokenguard/tokenguard/domain"
)

// AheadStore is what refreshing ahead of expiry and keeping idle grants alive need from the store.
type AheadStore interface {
	// ExpiringBefore lists up to limit active connections' tokens (without credentials) that expire
	// before t, soonest first, from the cursor after ("" first); next is "" after the last page.
	ExpiringBefore(ctx context.Context, t time.Time, after string, limit int) (due []domain.Token, next string, err error)
	// ObtainedBefore is ExpiringBefore for the tokens obtained before t, oldest first.
	ObtainedBefore(ctx context.Context, t time.Time, after string, limit int) (due []domain.Token, next string, err error)
	// TokenStore claims and stores the sweep's refreshes.
	TokenStore
}

// AheadReport counts what one sweep (RefreshAhead or KeepAlive) did.
type AheadReport struct {
	Due       int // connections listed
	Refreshed int
	Skipped   int // another process held the lock: it is refreshing them
	Fresh     int // already refreshed by someone else by the time we looked
	Failed    int
}

const (
	sweepPage   = 500 // connections listed per query: a sweep's memory is a page, however many are due
	sweepErrors = 20  // single-connection errors returned; the rest are only counted
)

// RefreshAhead refreshes every connection whose token expires within window, with at most
// concurrency requests at the provider at a time, skipping those another process is refreshing.
// Single connections' errors are counted, the first few joined into the returned error.
func (u *RefreshTokenUseCase) RefreshAhead(ctx context.Context, store AheadStore, window time.Duration, concurrency int) (AheadReport, error) {
	deadline := u.opts.Clock.Now().Add(window)
	return u.sweep(ctx, "refresh_ahead", store, store.ExpiringBefore, deadline, concurrency, func(t domain.Token) bool {
		return !t.Expiry.IsZero() && t.Expiry.Before(deadline)
	})
}

// KeepAlive refreshes, like RefreshAhead, every connection not refreshed for idle: some providers
// let an unused refresh token die. A stored provider's own keep-alive (Options.ProviderKeepAlives)
// replaces idle for its connections; idle 0 keeps alive only those.
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
	return u.sweep(ctx, "keep_alive", store, store.ObtainedBefore, now.Add(-shortest), concurrency, func(t domain.Token) bool {
		d := idle
		if o, ok := own[t.Provider]; ok {
			d = o
		}
		return d > 0 && t.ObtainedAt.Before(now.Add(-d))
	})
}

// sweep refreshes the due tokens list hands out, page by page. concurrency bounds the requests at
// the provider; twice as many connections are worked on, so claims and writes overlap the calls
// instead of adding to them. kind names the sweep in its span and, spaced, in its error.
func (u *RefreshTokenUseCase) sweep(ctx context.Context, kind string, store AheadStore,
	list func(ctx context.Context, t time.Time, after string, limit int) ([]domain.Token, string, error),
	t time.Time, concurrency int, due func(domain.Token) bool) (AheadReport, error) {
	ctx, span := u.opts.Tracer.Start(ctx, StepSweep, "")
	var (
		rep     AheadReport
		counts  [sweepFailed + 1]int // by sweepOutcome
		mu      sync.Mutex
		errs    []error
		toks    []domain.Token
		after   string
		listErr error
	)
	concurrency = max(concurrency, 1)
	calls := semaphore.NewWeighted(int64(concurrency))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(2 * concurrency)
	for {
		if toks, after, listErr = list(ctx, t, after, sweepPage); listErr != nil {
			break
		}
		rep.Due += len(toks)
		for _, tok := range toks {
			g.Go(func() error {
				outcome, err := u.sweepOne(gctx, store, calls, tok, due)
				mu.Lock()
				defer mu.Unlock()
				counts[outcome]++
				if outcome == sweepFailed && len(errs) < sweepErrors {
					errs = append(errs, fmt.Errorf("%s: %w", tok.Connection, err))
				}
				return nil
			})
		}
		if after == "" {
			break
		}
	}
	_ = g.Wait()
	rep.Refreshed, rep.Skipped, rep.Fresh, rep.Failed = counts[sweepRefreshed], counts[sweepSkipped], counts[sweepFresh], counts[sweepFailed]
	if n := rep.Failed - len(errs); n > 0 {
		errs = append(errs, fmt.Errorf("and %d more connection(s) failed", n))
	}
	err := errors.Join(append([]error{listErr}, errs...)...)
	span.End(Facts{Sweep: rep, SweepKind: kind}, err)
	if err != nil {
		err = fmt.Errorf("%s: %w", strings.ReplaceAll(kind, "_", " "), err)
	}
	return rep, err
}

type sweepOutcome int

const (
	sweepFresh sweepOutcome = iota
	sweepRefreshed
	sweepSkipped
	sweepFailed
)

// sweepOne refreshes t's connection (as listed, without credentials) if it is due and Claim still
// finds it so, holding an in-flight slot, and one of the sweep's calls, until the provider answers.
func (u *RefreshTokenUseCase) sweepOne(ctx context.Context, store AheadStore, calls *semaphore.Weighted, t domain.Token, due func(domain.Token) bool) (sweepOutcome, error) {
	ctx, span := u.opts.Tracer.Start(ctx, StepRefresh, t.Connection)
	var ev RefreshEvent
	busy := true // another holder has its refresh
	defer func() { span.End(ev.facts(busy), ev.Err) }()
	fresh := func(seen domain.Token) (sweepOutcome, error) {
		ev, busy = RefreshEvent{Connection: t.Connection, OldVersion: seen.Version, Provider: seen.Provider, Outcome: OutcomeSkippedFresh}, false
		return sweepFresh, nil
	}
	if t.Status != domain.StatusActive || !due(t) {
		return fresh(t)
	}
	if u.provider(t.Provider).budgetWait(u.opts.Clock.Now()) > 0 {
		return sweepSkipped, nil // callers come first; the next pass tries again
	}
	err := u.mayPresent(ctx, t, false)
	if err == nil {
		err = u.slots.Acquire(ctx, 1)
	}
	var c claimed
	if err == nil {
		c, err = u.lease(SpareBudget(ctx), store, t, u.opts.LockWait)
	}
	var r redeemed
	switch {
	case err != nil:
	case c.BudgetWait > 0, c.End == nil && (c.Lease.Running || c.Lease.Abandoned):
		return sweepSkipped, nil // the budget's reserve is the callers', or another holder has the refresh
	case c.End == nil:
		return fresh(c.Token)
	default:
		if err = calls.Acquire(ctx, 1); err != nil {
			c.End(true) // not presented
			c.release()
			break
		}
		slot := c.release
		c.release = sync.OnceFunc(func() { slot(); calls.Release(1) })
		r, err = u.redeem(ctx, store, c)
	}
	busy = false
	ev = RefreshEvent{Connection: t.Connection, OldVersion: t.Version, Provider: t.Provider}
	ev.Err = u.redeemEnded(&ev, r, err, nil)
	ev.Outcome = cmp.Or(ev.Outcome, outcome(ev.Err))
	u.observe(ev)
	if ev.Err != nil {
		return sweepFailed, ev.Err
	}
	return sweepRefreshed, nil
}

// Every calls fn every interval until ctx ends: the loop of the background rounds in the outer layers.
func Every(ctx context.Context, interval time.Duration, fn func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}
