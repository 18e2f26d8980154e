package usecase

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// claimed is what the claim of a refresh found.
type claimed struct {
	current domain.Token  // the stored token, as last read (under the lock if claimed)
	waited  time.Duration // from the first look until the claim
	other   bool          // waited for another holder's lease
	// end ends the lease this caller took to refresh current; nil when
	// current needs no refresh (or cannot have one).
	end func(release bool)
	// why notes why the refresh ends without a stored token, for the
	// connection's history (Claim.Why); nil when the store keeps none.
	why func(reason string)
	// release frees this process's in-flight slot, held with the lease
	// until the provider answered.
	release func()
}

// note tells the store why c's refresh ends without a stored token.
func (c claimed) note(reason string) {
	if c.why != nil {
		c.why(reason)
	}
}

// claim leases the refresh of connection's token while due says it needs
// one. Each turn looks at seen, the stored token as last read: done when
// it is not due (or dead); refused while this process may not present it
// (a paused provider, a failure's pause, a forced refresh too soon);
// otherwise, holding a slot of this process's in-flight refreshes, it
// claims seen's version (TokenStore.Claim). A claim that finds another
// holder's lease waits, holding nothing, for that refresh's announcement
// and looks again; one that finds the stored token moved looks at what it
// found. The lock wait bounds it all.
func (u *RefreshTokenUseCase) claim(ctx context.Context, connection string, forced bool, due func(domain.Token) bool, seen domain.Token) (claimed, error) {
	asked := time.Now()
	c := claimed{current: seen}
	_, waiting := u.opts.Tracer.Start(ctx, StepLockWait, connection)
	done := func(err error) (claimed, error) {
		c.waited = time.Since(asked)
		waiting.End(Facts{Waited: c.other}, err)
		return c, err
	}
	for {
		t := c.current
		if t.Status == domain.StatusNeedsReauth || !due(t) {
			return done(nil)
		}
		if err := u.mayPresent(ctx, t, forced); err != nil {
			return done(err)
		}
		// Watched from before the claim: the announcement of the holder
		// it may find is not missed.
		woken, unwatch := u.announced.watch(connection)
		if w := u.budgets.wait(t.Provider, u.opts.Clock.Now()); w > 0 {
			// The provider's budget was found spent: no need to ask the store.
			err := u.budgetHeld(ctx, t, w, forced, asked, woken)
			unwatch()
			if err != nil {
				return done(err)
			}
			c.other = true
			if c.current, _, err = u.look(ctx, connection, asked, due, forced, nil); err != nil {
				return done(err)
			}
			continue
		}
		cl, err := u.claimWithSlot(ctx, t, asked, woken)
		if cl.End != nil {
			unwatch()
			c.current, c.end, c.why = cl.Token, cl.End, cl.Why
			c.release = sync.OnceFunc(func() { u.slots.Release(1) })
			return done(nil)
		}
		switch {
		case errors.Is(err, errAnnounced):
			err = nil // another process stored the token while this one queued
		case err != nil:
		case cl.BudgetWait > 0:
			u.budgets.spent(t.Provider, u.opts.Clock.Now().Add(cl.BudgetWait))
			c.current = cl.Token
			err = u.budgetHeld(ctx, cl.Token, cl.BudgetWait, forced, asked, woken)
		case cl.Lease.Running && !u.overdue(cl.Lease, forced):
			err = u.awaitLease(ctx, asked, woken)
		case cl.Lease.Running || cl.Lease.Abandoned:
			// Read again: look says what an overdue or abandoned lease means.
		case cl.Token.Version == t.Version && cl.Token.Failure.Failures == t.Failure.Failures && cl.Token.Status == t.Status:
			// Nothing moved, and yet no lease: a stored status this
			// release does not refresh.
			err = fmt.Errorf("claim the refresh of %s at version %d: %w", connection, t.Version, domain.ErrConflict)
		default:
			unwatch()
			c.current = cl.Token // the stored token moved: look at it
			continue
		}
		unwatch()
		if err != nil {
			return done(err)
		}
		c.other = true
		if c.current, _, err = u.look(ctx, connection, asked, due, forced, nil); err != nil {
			return done(err)
		}
	}
}

// budgetHeld is what a spent token budget means for a caller holding t: a
// still-valid token is served (and its refresh queued unless forced), an
// expired one waits for the budget.
func (u *RefreshTokenUseCase) budgetHeld(ctx context.Context, t domain.Token, wait time.Duration, forced bool,
	asked time.Time, woken <-chan struct{}) error {
	if !usable(t, u.opts.Clock.Now()) {
		return u.awaitBudget(ctx, wait, asked, woken)
	}
	if !forced {
		u.hold(t)
	}
	return budgetSpent(wait)
}

// claimWithSlot takes one of this process's in-flight slots (errAnnounced
// if woken first) and claims t with it; the slot is kept only with the
// lease.
func (u *RefreshTokenUseCase) claimWithSlot(ctx context.Context, t domain.Token, asked time.Time, woken <-chan struct{}) (Claim, error) {
	if err := u.acquireSlot(ctx, woken); err != nil {
		return Claim{}, err
	}
	cl, err := u.claimOnce(ctx, t, asked)
	if cl.End == nil {
		u.slots.Release(1)
	}
	return cl, err
}

// claimOnce is one TokenStore.Claim of t within the lock wait that began
// at asked, traced.
func (u *RefreshTokenUseCase) claimOnce(ctx context.Context, t domain.Token, asked time.Time) (Claim, error) {
	left := u.opts.LockWait - time.Since(asked)
	if left <= 0 {
		return Claim{}, fmt.Errorf("%w: %w", domain.ErrLockTimeout, domain.ErrRefreshInProgress)
	}
	lockCtx, cancel := context.WithTimeout(ctx, left)
	defer cancel()
	_, span := u.opts.Tracer.Start(lockCtx, StepLease, t.Connection)
	cl, err := u.store.Claim(lockCtx, t, u.opts.AnswerDeadline)
	other := cl.Lease.Running || cl.Lease.Abandoned
	span.End(Facts{Provider: t.Provider, OldVersion: t.Version, Waited: other}, err)
	_, reread := u.opts.Tracer.Start(lockCtx, StepReread, t.Connection)
	reread.End(Facts{Provider: cl.Token.Provider, OldVersion: cl.Token.Version}, err)
	return cl, err
}

// mayPresent says whether this process may present t's refresh token now:
// not while its provider's calls pause, while t's failure episode says
// wait, or for a forced refresh sooner than forceGap after the last one;
// nor once ctx is done (past the claim the refresh token is spent, and its
// answer must reach the database whatever the caller does).
func (u *RefreshTokenUseCase) mayPresent(ctx context.Context, t domain.Token, forced bool) error {
	now := u.opts.Clock.Now()
	if err := u.gate.of(t.Provider).check(now); err != nil {
		return err
	}
	if err := u.hung.of(t.Provider).check(now); err != nil {
		return err
	}
	if err := checkFailure(t, now); err != nil {
		return err
	}
	if forced && !u.forced.allow(t.Connection, now, u.forceGap(t)) {
		return domain.ErrRefreshRateLimited
	}
	return ctx.Err()
}

// look reads connection's token without the lock. It is done when the
// token needs no refresh (or cannot have one). While another holder's
// lease on it runs, it waits for that refresh's announcement, reading
// again (holding nothing) at each poll, until the lock wait that began at
// asked is over (an error that is also a lock timeout); waiting, if not
// nil, is called when it starts to wait. A lease abandoned by its holder
// is recorded as a lost answer; one whose answer is overdue is not waited
// for (errAnswerPending) unless forced.
func (u *RefreshTokenUseCase) look(ctx context.Context, connection string, asked time.Time, due func(domain.Token) bool,
	forced bool, waiting func()) (domain.Token, bool, error) {
	for {
		// Watch before the read: an announcement between the read and the
		// wait is not missed.
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
			return t, false, u.answerPending(lease)
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

// Waits for another holder: the next look comes at its announcement (the
// change listener), or after leasePoll, or after leasePollListening while
// the listener is connected (announcements then come; the look is for a
// holder that died, whose lease runs out a second after its last
// renewal).
const (
	leasePoll          = 100 * time.Millisecond
	leasePollListening = time.Second
)

// awaitLease waits, at most a poll, before the next look at a connection
// whose refresh another holder has. It gives up, with an error that is
// also a lock timeout, when the lock wait that began at asked is over.
func (u *RefreshTokenUseCase) awaitLease(ctx context.Context, asked time.Time, woken <-chan struct{}) error {
	left := u.opts.LockWait - time.Since(asked)
	if left <= 0 {
		return fmt.Errorf("%w: %w", domain.ErrLockTimeout, domain.ErrRefreshInProgress)
	}
	poll := leasePoll
	if u.cache.trusted.Load() {
		poll = leasePollListening
	}
	t := time.NewTimer(min(poll, left))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("%w (%w)", ctx.Err(), domain.ErrRefreshInProgress)
	case <-woken:
	case <-t.C:
	}
	return nil
}

// acquireSlot takes one of this process's in-flight slots, unless the
// connection is announced first (errAnnounced): the refresh the caller
// queued for may have been done by another process meanwhile, and at a
// mass expiry most queued refreshes are.
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
	if err := u.slots.Acquire(qctx, 1); err != nil {
		if cause := context.Cause(qctx); errors.Is(cause, errAnnounced) && ctx.Err() == nil {
			return errAnnounced
		}
		return err
	}
	return nil
}

var errAnnounced = errors.New("announced while queued for a slot")
