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

// AheadStore is what refreshing ahead of expiry needs from the store.
type AheadStore interface {
	// ExpiringBefore lists the active connections whose token expires
	// before t, soonest first.
	ExpiringBefore(ctx context.Context, t time.Time) ([]string, error)
	// TryInLock runs fn like TokenStore.InLock if the connection's lock is
	// free right now, and reports false without waiting if it is not.
	TryInLock(ctx context.Context, connectionID string, hold time.Duration,
		fn func(ctx context.Context, s LockedStore) error) (bool, error)
}

// AheadReport counts what one RefreshAhead pass did.
type AheadReport struct {
	Due       int // connections expiring inside the window
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
	var refreshed, skipped, fresh, failed atomic.Int64
	errs := make([]error, len(ids))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(concurrency, 1))
	for i, id := range ids {
		g.Go(func() error {
			redeemed := false
			var revoked error
			var rotated *domain.Token
			var out domain.Token
			ev := RefreshEvent{ConnectionID: id}
			locked, err := store.TryInLock(gctx, id, u.hold(), func(txCtx context.Context, s LockedStore) error {
				t, err := s.Get(txCtx, id)
				if err != nil {
					return err
				}
				ev.OldVersion = t.Version
				if t.Status != domain.StatusActive || t.Expiry.IsZero() || !t.Expiry.Before(deadline) {
					return nil // someone refreshed it since we listed it
				}
				out, revoked, rotated, err = u.redeem(txCtx, s, t, &ev.ProviderLatency)
				redeemed = err == nil && revoked == nil
				return err
			})
			if err != nil && rotated != nil {
				out, err = u.rescue(id, *rotated, err)
				redeemed = err == nil
			}
			if locked && (redeemed || err != nil || revoked != nil) {
				ev.NewVersion, ev.Err = out.Version, errors.Join(err, revoked)
				switch {
				case redeemed:
					ev.Outcome = OutcomeOK
				case revoked != nil:
					ev.Outcome = OutcomeInvalidGrant
					u.opts.OnNeedsReauth(id, reason(revoked))
				case errors.Is(err, domain.ErrProviderUnavailable):
					ev.Outcome = OutcomeTransientError
				default:
					ev.Outcome = OutcomeError
				}
				u.observe(ev)
			}
			switch {
			case err != nil || revoked != nil:
				failed.Add(1)
				errs[i] = fmt.Errorf("%s: %w", id, errors.Join(err, revoked))
			case !locked:
				skipped.Add(1)
			case redeemed:
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
