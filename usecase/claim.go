package usecase

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// claimed is what a refresh's claim found: Token as last read (under the lock if claimed), End nil
// when it needs no refresh.
type claimed struct {
	Claim
	waited  time.Duration // from the first look until the claim
	other   bool          // waited for another holder's lease
	release func()        // frees the in-flight slot, held until the provider answered
}

// note tells the store why c's refresh ends without a stored token.
func (c claimed) note(reason string) {
	if c.Why != nil {
		c.Why(reason)
	}
}

// claim leases the refresh of connection's token while due says it needs one, starting from seen.
// A claim that finds another holder's lease waits, holding nothing, for its announcement and looks
// again; one that finds the stored token moved looks at that. The lock wait bounds it all.
func (u *RefreshTokenUseCase) claim(ctx context.Context, connection string, forced bool, due func(domain.Token) bool, seen domain.Token) (claimed, error) {
	asked := time.Now()
	c := claimed{Claim: Claim{Token: seen}}
	_, waiting := u.opts.Tracer.Start(ctx, StepLockWait, connection)
	done := func(err error) (claimed, error) {
		c.waited = time.Since(asked)
		waiting.End(Facts{Waited: c.other}, err)
		return c, err
	}
	for {
		t := c.Token
		if t.Status == domain.StatusNeedsReauth || !due(t) {
			return done(nil)
		}
		if err := u.mayPresent(ctx, t, forced); err != nil {
			return done(err)
		}
		// Watched before the claim, so the announcement is not missed.
		woken, unwatch := u.announced.watch(connection)
		var err error
		if w := u.provider(t.Provider).budgetWait(u.opts.Clock.Now()); w > 0 {
			// The provider's budget was found spent: no need to ask the store.
			err = u.budgetHeld(ctx, t, w, forced, asked, woken)
		} else {
			var cl claimed
			if err = u.acquireSlot(ctx, woken); err == nil {
				cl, err = u.claimOnce(ctx, t, asked)
			}
			switch {
			case cl.End != nil:
				unwatch()
				c.Claim, c.release = cl.Claim, cl.release
				return done(nil)
			case errors.Is(err, errAnnounced):
				err = nil // another process stored the token while this one queued
			case err != nil:
			case cl.BudgetWait > 0:
				u.provider(t.Provider).spent(u.opts.Clock.Now().Add(cl.BudgetWait))
				c.Token = cl.Token
				err = u.budgetHeld(ctx, cl.Token, cl.BudgetWait, forced, asked, woken)
			case cl.Lease.Running && !u.overdue(cl.Lease, forced):
				err = u.awaitLease(ctx, asked, woken)
			case cl.Lease.Running || cl.Lease.Abandoned:
				// Read again: look says what an overdue or abandoned lease means.
			case cl.Token.Version == t.Version && cl.Token.Failure.Failures == t.Failure.Failures && cl.Token.Status == t.Status:
				// Nothing moved, yet no lease: a status this release does not refresh.
				err = fmt.Errorf("claim the refresh of %s at version %d: %w", connection, t.Version, domain.ErrConflict)
			default:
				unwatch()
				c.Token = cl.Token // the stored token moved: look at it
				continue
			}
		}
		unwatch()
		if err != nil {
			return done(err)
		}
		c.other = true
		if c.Token, _, err = u.look(ctx, connection, asked, due, forced, nil); err != nil {
			return done(err)
		}
	}
}

// budgetHeld: with the budget spent, a valid t is served (its refresh queued unless forced); an
// expired one waits for the budget.
func (u *RefreshTokenUseCase) budgetHeld(ctx context.Context, t domain.Token, wait time.Duration, forced bool,
	asked time.Time, woken <-chan struct{}) error {
	spent := fmt.Errorf("%w (for %v)", domain.ErrTokenBudgetSpent, wait.Round(time.Millisecond))
	if !usable(t, u.opts.Clock.Now()) {
		return u.await(ctx, wait, asked, woken, spent)
	}
	if !forced {
		u.hold(t)
	}
	return spent
}

// claimOnce is one traced lease, holding an in-flight slot, within the lock wait begun at asked.
func (u *RefreshTokenUseCase) claimOnce(ctx context.Context, t domain.Token, asked time.Time) (claimed, error) {
	left := u.opts.LockWait - time.Since(asked)
	if left <= 0 {
		u.slots.Release(1)
		return claimed{}, fmt.Errorf("%w: %w", domain.ErrLockTimeout, domain.ErrRefreshInProgress)
	}
	_, span := u.opts.Tracer.Start(ctx, StepLease, t.Connection)
	c, err := u.lease(ctx, u.store, t, left)
	span.End(Facts{Provider: t.Provider, OldVersion: t.Version, Waited: c.Lease.Running || c.Lease.Abandoned}, err)
	_, reread := u.opts.Tracer.Start(ctx, StepReread, t.Connection)
	reread.End(Facts{Provider: c.Token.Provider, OldVersion: c.Token.Version}, err)
	return c, err
}

// lease claims t's refresh in store within wait, holding an in-flight slot: the slot is kept only
// with the lease, until the provider answered (release).
func (u *RefreshTokenUseCase) lease(ctx context.Context, store TokenStore, t domain.Token, wait time.Duration) (claimed, error) {
	lockCtx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	cl, err := store.Claim(lockCtx, t, u.opts.callWindow())
	if cl.End == nil {
		u.slots.Release(1)
		return claimed{Claim: cl}, err
	}
	return claimed{Claim: cl, release: sync.OnceFunc(func() { u.slots.Release(1) })}, err
}

// mayPresent refuses to present t's refresh token while its provider's calls pause, its failure episode
// says wait, a forced refresh comes too soon, or ctx is done (past the claim the refresh runs on).
func (u *RefreshTokenUseCase) mayPresent(ctx context.Context, t domain.Token, forced bool) error {
	now := u.opts.Clock.Now()
	p := u.provider(t.Provider)
	if err := cmp.Or(p.gate.check(now), p.hung.check(now), checkFailure(t, now)); err != nil {
		return err
	}
	if forced {
		gap := u.opts.ForceInterval // or half t's lifetime if shorter
		if life := t.Expiry.Sub(t.ObtainedAt); !t.Expiry.IsZero() && !t.ObtainedAt.IsZero() && life > 0 {
			gap = min(gap, life/2)
		}
		if !u.forced.allow(t.Connection, now, gap) {
			return domain.ErrRefreshRateLimited
		}
	}
	return ctx.Err()
}

// look reads connection's token without the lock; done when it needs no refresh (or cannot have
// one). It waits out another holder's running lease within the lock wait begun at asked, calling
// waiting (if not nil) once when it starts; an abandoned lease is recorded as a lost answer, an
// overdue one is not waited for (errAnswerPending) unless forced.
func (u *RefreshTokenUseCase) look(ctx context.Context, connection string, asked time.Time, due func(domain.Token) bool,
	forced bool, waiting func()) (domain.Token, bool, error) {
	for {
		// Watched before the read, so the announcement is not missed.
		woken, unwatch := u.announced.watch(connection)
		readCtx, cancel := context.WithTimeout(ctx, u.opts.LockWait)
		t, lease, err := u.store.Read(readCtx, connection)
		cancel()
		switch {
		case err != nil:
			unwatch()
			return t, false, err
		case t.Status == domain.StatusNeedsReauth || !due(t):
			unwatch()
			return t, true, nil
		case lease.Abandoned:
			unwatch()
			t, err = u.abandoned(ctx, t)
			return t, false, err
		case !lease.Running:
			unwatch()
			return t, false, nil
		case u.overdue(lease, forced):
			unwatch()
			return t, false, fmt.Errorf("%w: %w: %w (presented %v ago)", domain.ErrProviderUnavailable,
				domain.ErrRefreshInProgress, errAnswerPending, lease.Age.Round(time.Millisecond))
		}
		if waiting != nil {
			waiting()
			waiting = nil
		}
		err = u.awaitLease(ctx, asked, woken)
		unwatch()
		if err != nil {
			return t, false, err
		}
	}
}

// A wait for another holder ends at its announcement or after a poll; while the listener is
// connected, the slower poll only catches a holder that died.
const (
	leasePoll          = 100 * time.Millisecond
	leasePollListening = time.Second
)

// awaitLease waits at most a poll for another holder's refresh.
func (u *RefreshTokenUseCase) awaitLease(ctx context.Context, asked time.Time, woken <-chan struct{}) error {
	poll := leasePoll
	if u.cache.trusted.Load() {
		poll = leasePollListening
	}
	return u.await(ctx, poll, asked, woken, domain.ErrRefreshInProgress)
}

// await waits, holding nothing, for d or an announcement (woken); past the lock wait begun at
// asked it fails with a lock timeout. Errors wrap why.
func (u *RefreshTokenUseCase) await(ctx context.Context, d time.Duration, asked time.Time, woken <-chan struct{}, why error) error {
	left := u.opts.LockWait - time.Since(asked)
	if left <= 0 {
		return fmt.Errorf("%w: %w", domain.ErrLockTimeout, why)
	}
	t := time.NewTimer(min(d, left))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("%w (%w)", ctx.Err(), why)
	case <-woken:
	case <-t.C:
	}
	return nil
}

// acquireSlot takes an in-flight slot unless the connection is announced first (errAnnounced): at a
// mass expiry another process has done most queued refreshes meanwhile.
func (u *RefreshTokenUseCase) acquireSlot(ctx context.Context, woken <-chan struct{}) error {
	if u.slots.TryAcquire(1) {
		return nil
	}
	qctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-woken:
			cancel(errAnnounced)
		case <-qctx.Done():
		}
	}()
	err := u.slots.Acquire(qctx, 1)
	if err != nil && errors.Is(context.Cause(qctx), errAnnounced) && ctx.Err() == nil {
		return errAnnounced
	}
	return err
}

var errAnnounced = errors.New("announced while queued for a slot")
