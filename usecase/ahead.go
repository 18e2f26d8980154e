package usecase

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/tokenguard/tokenguard/domain"
)

// AheadStore is what refreshing ahead of expiry and keeping idle grants
// alive need from the store.
type AheadStore interface {
	// ExpiringBefore lists the active connections whose token expires
	// before t, soonest first.
	ExpiringBefore(ctx context.Context, t time.Time) ([]string, error)
	// ObtainedBefore lists the active connections whose token was obtained
	// before t, oldest first.
	ObtainedBefore(ctx context.Context, t time.Time) ([]string, error)
	// TryInLock runs fn like TokenStore.InLock if the connection's lock is
	// free right now, and reports false without waiting if it is not.
	TryInLock(ctx context.Context, connectionID string, hold time.Duration,
		fn func(ctx context.Context, s LockedStore) error) (bool, error)
}

// AheadReport counts what one sweep (RefreshAhead or KeepAlive) did.
type AheadReport struct {
	Due       int // connections listed
	Refreshed int
	Skipped   int // another process held the lock: it is refreshing them
	Fresh     int // already refreshed by someone else by the time we looked
	Failed    int
}

// RefreshAhead refreshes every connection whose token expires within
// window, at most concurrency at a time, so that callers rarely meet a
// stale token. Connections another process is refreshing right now are
// skipped rather than queued behind. Errors of single connections are
// counted and joined into the returned error; the pass goes on.
func (u *RefreshTokenUseCase) RefreshAhead(ctx context.Context, store AheadStore, window time.Duration, concurrency int) (AheadReport, error) {
	deadline := u.opts.Clock.Now().Add(window)
	ids, err := store.ExpiringBefore(ctx, deadline)
	if err != nil {
		return AheadReport{}, fmt.Errorf("refresh ahead: %w", err)
	}
	return u.sweep(ctx, store, ids, concurrency, func(t domain.Token) bool {
		return !t.Expiry.IsZero() && t.Expiry.Before(deadline)
	})
}

// KeepAlive refreshes every connection whose token was not refreshed for
// idle, like RefreshAhead: some providers let a refresh token die when it
// is not used for a while (30, 90, 100 days), even though its grant stands.
func (u *RefreshTokenUseCase) KeepAlive(ctx context.Context, store AheadStore, idle time.Duration, concurrency int) (AheadReport, error) {
	cutoff := u.opts.Clock.Now().Add(-idle)
	ids, err := store.ObtainedBefore(ctx, cutoff)
	if err != nil {
		return AheadReport{}, fmt.Errorf("keep alive: %w", err)
	}
	return u.sweep(ctx, store, ids, concurrency, func(t domain.Token) bool {
		return t.ObtainedAt.Before(cutoff)
	})
}

// sweep refreshes the connections ids whose token, read under the lock,
// is active and due, at most concurrency at a time, skipping those whose
// lock is taken.
func (u *RefreshTokenUseCase) sweep(ctx context.Context, store AheadStore, ids []string, concurrency int, due func(domain.Token) bool) (AheadReport, error) {
	var refreshed, skipped, fresh, failed atomic.Int64
	errs := make([]error, len(ids))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(concurrency, 1))
	for i, id := range ids {
		g.Go(func() error {
			var r redeemed
			called := false
			ev := RefreshEvent{ConnectionID: id}
			locked, err := store.TryInLock(gctx, id, u.hold(), func(txCtx context.Context, s LockedStore) error {
				t, err := s.Get(txCtx, id)
				if err != nil {
					return err
				}
				ev.OldVersion = t.Version
				if t.Status != domain.StatusActive || !due(t) {
					return nil // someone refreshed it since we listed it
				}
				called = true
				if err := u.gate.check(u.opts.Clock.Now()); err != nil {
					return err
				}
				r, err = u.redeem(txCtx, s, t)
				return err
			})
			if err != nil && r.rotated != nil {
				r.tok, err = u.rescue(id, r, err)
			}
			if locked && (called || err != nil) {
				ev.NewVersion, ev.ProviderLatency, ev.Err = r.tok.Version, r.latency, errors.Join(err, r.revoked)
				ev.Outcome = outcome(err)
				if r.revoked != nil {
					ev.Outcome = OutcomeInvalidGrant
					u.opts.OnNeedsReauth(id, reason(r.revoked))
				}
				u.observe(ev)
			}
			switch {
			case err != nil || r.revoked != nil:
				failed.Add(1)
				errs[i] = fmt.Errorf("%s: %w", id, errors.Join(err, r.revoked))
			case !locked:
				skipped.Add(1)
			case called:
				refreshed.Add(1)
			default:
				fresh.Add(1)
			}
			return nil
		})
	}
	_ = g.Wait()
	rep := AheadReport{Due: len(ids), Refreshed: int(refreshed.Load()), Skipped: int(skipped.Load()), Fresh: int(fresh.Load()), Failed: int(failed.Load())}
	return rep, errors.Join(errs...)
}
