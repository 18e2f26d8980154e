package usecase

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"golang.org/x/sync/semaphore"

	"github.com/tokenguard/tokenguard/domain"
)

// RefreshTokenUseCase hands out a connection's access token, reusing it
// until it nearly expires and then refreshing it under the connection's
// lock, at most once per expiry however many callers race for it.
// It is safe for concurrent use.
type RefreshTokenUseCase struct {
	store     TokenStore
	refresher Refresher
	opts      Options
	cache     tokenCache
	flights   flights
	slots     *semaphore.Weighted // refreshes in flight in this process, queued in order
	announced announcements       // wakes the callers waiting for another process's refresh

	gate       clientGates // per provider: pauses its calls after it rejected the client
	hung       clientGates // per provider: pauses its calls after one went unanswered past RefreshTimeout
	forced     throttle    // connection -> last forced refresh
	errorLines throttle    // connection -> last ERROR line about the client
}

// NewRefreshTokenUseCase builds the use case.
func NewRefreshTokenUseCase(store TokenStore, refresher Refresher, opts Options) (*RefreshTokenUseCase, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	u := &RefreshTokenUseCase{store: store, refresher: refresher, opts: opts, flights: flights{log: opts.Logger},
		slots:  semaphore.NewWeighted(int64(opts.MaxRefreshesInFlight)),
		forced: throttle{keep: opts.ForceInterval}, errorLines: throttle{keep: errorLineEvery},
		gate: clientGates{why: "after it rejected the client"}, hung: clientGates{why: "while a refresh it was sent goes unanswered"}}
	u.cache.capacity, u.cache.clock = int64(max(opts.CacheSize, 0)), opts.Clock
	return u, nil
}

// Token returns a token for connection that is valid for at least the
// skew, without its refresh token. Errors wrap domain.ErrNotFound, domain.ErrNeedsReauth,
// domain.ErrLockTimeout, domain.ErrProviderUnavailable,
// domain.ErrClientRejected, domain.ErrEndpointMisconfigured,
// domain.ErrStoreUnavailable or the context's error.
//
// A cached fresh token costs no query and no lock. Otherwise one goroutine
// per connection and process reads the store (and refreshes if needed)
// while the others wait for it.
//
// Its path is kept short, in few and small frames (the token written
// straight into the result, the span's end and the errors in frames of
// their own): at an expiry hundreds of goroutines arrive at once, many of
// them new, and a path that outgrows a new goroutine's first stack has
// every one of them copy its stack (TestWaitersFitTheirFirstStack).
func (u *RefreshTokenUseCase) Token(ctx context.Context, connection string) (t domain.Token, err error) {
	s, state := u.cache.get(connection, u.opts.Clock.Now())
	u.opts.Observer.CacheLookup(state == hit)
	if state == hit {
		return s.tok, nil
	}
	// The slow path: join (or start) the connection's flight and wait
	// for it.
	var cached *snapshot // the cached token, known to be stale
	if state == stale {
		cached = s
	}
	ctx, span := u.opts.Tracer.Start(ctx, StepToken, connection)
	if err = ctx.Err(); err != nil {
		_, err = endToken(span, connection, nil, err)
		return t, err
	}
	fl := u.flights.join(ctx, connection, func(ctx context.Context) (domain.Token, error) {
		return u.load(ctx, connection, cached)
	})
	if ctx.Done() == nil { // flights.wait, with no select: one frame less on the way
		<-fl.done
	} else {
		fl, err = u.flights.wait(ctx, connection, fl)
	}
	if fl, err = endToken(span, connection, fl, err); err != nil {
		return t, err
	}
	t = fl.tok
	t.RefreshToken = domain.Secret{} // see withoutRefreshToken
	return t, nil
}

// withoutRefreshToken is what callers get: the refresh token is spent only
// under the connection's lock, and a caller that had it could spend it
// outside.
func withoutRefreshToken(t domain.Token) domain.Token {
	t.RefreshToken = domain.Secret{}
	return t
}

// endToken ends Token's span with the flight's outcome.
//
//go:noinline
func endToken(span Span, connection string, fl *flight, err error) (*flight, error) {
	if err == nil {
		err = fl.err
	}
	if err != nil {
		span.End(Facts{}, err)
		return nil, fmt.Errorf("token for %s: %w", connection, err)
	}
	span.End(Facts{Provider: fl.tok.Provider, NewVersion: fl.tok.Version}, nil)
	return fl, nil
}

// Invalidate tells the use case that another process stored version of
// connection's token; any older cached copy is dropped.
func (u *RefreshTokenUseCase) Invalidate(connection string, version int64) {
	u.opts.Observer.Invalidated()
	u.cache.knew(connection, version, true)
	u.cache.invalidate(connection, version)
	u.announced.announce(connection)
}

// TrustCache turns the in-process cache on while the caller guarantees
// Invalidate is called for every change committed by other processes (the
// change listener is connected), and off when it no longer can. Either call
// forgets everything cached so far.
func (u *RefreshTokenUseCase) TrustCache(trusted bool) {
	u.cache.setTrusted(trusted)
}

// load reads the stored token and refreshes it if it is stale. When the
// cache already knows the current token is stale (cached), the read outside
// the lock is skipped: the refresh re-reads inside it anyway.
func (u *RefreshTokenUseCase) load(ctx context.Context, connection string, cached *snapshot) (domain.Token, error) {
	epoch := u.cache.begin()
	var seen domain.Token
	if cached != nil {
		seen = cached.tok
	} else {
		t, done, err := u.read(ctx, connection)
		if errors.Is(err, errAnswerPending) && usable(t, u.opts.Clock.Now()) {
			return t, nil // served, not cached: the next caller looks again
		}
		if err != nil {
			return domain.Token{}, err
		}
		if done {
			u.cache.put(t, epoch, u.skewOf(t))
			return t, nil
		}
		seen = t
	}
	t, err := u.refresh(ctx, connection, false, u.stale, seen)
	if err != nil {
		return domain.Token{}, fmt.Errorf("refresh: %w", err)
	}
	u.cache.put(t, epoch, u.skewOf(t))
	return t, nil
}

// read is load's read outside the lock. It is done when the stored token
// is fresh, or was stale but another process's refresh of it, under way
// as read, stored a fresh one meanwhile: a process that finds a lease
// waits for its announcement rather than take a slot, a pool connection
// and the lock only to be told so (at a mass expiry, most do).
func (u *RefreshTokenUseCase) read(ctx context.Context, connection string) (domain.Token, bool, error) {
	// Watch before the read: an announcement between the read and the wait
	// is not missed.
	woken, unwatch := u.announced.watch(connection)
	defer unwatch()
	readCtx, cancel := context.WithTimeout(ctx, u.opts.LockWait)
	t, lease, err := u.store.GetWithLease(readCtx, connection)
	cancel()
	switch {
	case err != nil:
		return t, false, err
	case t.Status == domain.StatusNeedsReauth:
		return t, false, needsReauth(t)
	case !u.stale(t):
		return t, true, nil
	case lease.Abandoned:
		t, err = u.abandoned(ctx, t)
		return t, false, err
	case !lease.Running:
		return t, false, nil
	case u.overdue(lease):
		return t, false, u.answerPending(lease)
	}
	asked := time.Now()
	_, span := u.opts.Tracer.Start(ctx, StepLockWait, connection)
	if _, err := u.awaitLease(ctx, asked, woken, u.leasePoll(), domain.ErrRefreshInProgress); err != nil {
		span.End(Facts{Waited: true}, err)
		return t, false, err
	}
	t, done, err := u.lookAgain(ctx, connection, asked, u.stale)
	span.End(Facts{Waited: true}, err)
	switch {
	case ctx.Err() != nil:
		return t, false, err
	case done && t.Status == domain.StatusNeedsReauth:
		return t, false, needsReauth(t)
	}
	// Still leased after the lock wait, or free: the refresh path decides
	// (it serves a still-valid token through a lease that will not end).
	return t, done, nil
}

// refresh redeems connection's refresh token if the stored token is still
// due (nobody refreshed it meanwhile), without holding a database
// connection while the provider answers:
//
//  1. claim: under the connection's lock, re-read; if still due, take the
//     refresh lease and commit (the lock and the connection are let go).
//     With a token seen due, the lease is bid for with the lock: lock,
//     re-read, lease and commit are one round trip;
//  2. the provider call, with nothing held but the lease and a slot of
//     this process's in-flight refreshes;
//  3. keep: under the lock again, store the rotated token if the stored
//     version is still the one leased, ending the lease, and commit.
//
// A caller that finds another process's lease waits for that refresh's
// announcement (the change listener), or looks again within the lock wait.
//
// The rotation window: between the provider's answer and the commit, the
// new refresh token exists only here, and the old one is already dead. If
// the write fails (the database connection dropped, the commit failed),
// keep retries it in fresh transactions for RescueWindow, logging loudly,
// instead of dropping it; the lease runs meanwhile.
func (u *RefreshTokenUseCase) refresh(ctx context.Context, connection string, forced bool, due func(domain.Token) bool, seen domain.Token) (domain.Token, error) {
	var (
		out domain.Token
		r   redeemed
	)
	ctx, span := u.opts.Tracer.Start(ctx, StepRefresh, connection)
	ev := RefreshEvent{Connection: connection, Forced: forced}
	asked := time.Now()
	c, err := u.claim(ctx, connection, forced, due, seen)
	current := c.current // the stored token, as read under the lock
	ev.LockWait, ev.OldVersion, ev.Provider = c.waited, current.Version, current.Provider
	switch {
	case err != nil:
	case c.end == nil && current.Status == domain.StatusNeedsReauth:
		err = needsReauth(current)
	case c.end == nil:
		out, ev.Outcome = current, OutcomeSkippedFresh
	default:
		r, err = u.redeem(ctx, u.store, c)
		out = r.tok
	}
	if ev.LockWait == 0 {
		ev.LockWait = time.Since(asked) // never got the lock
	}
	ev.ProviderLatency = r.latency
	if err == nil && r.revoked != nil {
		ev.Outcome, err = OutcomeInvalidGrant, r.revoked
		u.opts.Logger.Error("connection needs re-authorisation: the provider rejected its grant",
			"connection", connection, "reason", r.reason)
		u.opts.OnNeedsReauth(connection, r.reason)
	}
	var stillValid error // the failure a still-valid token is served through
	if err != nil && !forced && untouched(err) && usable(current, u.opts.Clock.Now()) {
		// The provider is down or rejects the client, but the stored token
		// has not expired yet: the skew is there for exactly this. Serve
		// it; it is not cached as fresh, so the next caller tries again.
		if errors.Is(err, domain.ErrProviderUnavailable) && !errors.Is(err, domain.ErrRefreshFailing) {
			u.opts.Logger.Warn("token refresh failed; serving the current token until it expires",
				"connection", connection, "version", current.Version,
				"expires_in", current.Expiry.Sub(u.opts.Clock.Now()).Round(time.Millisecond), "err", err)
		}
		stillValid, out, err = err, current, nil
	}
	if ev.Outcome == "" {
		ev.Outcome = outcome(cmp.Or(err, stillValid))
	}
	ev.NewVersion, ev.Err = out.Version, cmp.Or(err, stillValid)
	u.observe(ev)
	span.End(ev.facts(c.other), ev.Err)
	if err != nil {
		return domain.Token{}, err
	}
	return out, nil
}

// claimed is what the first transaction of a refresh found.
type claimed struct {
	current domain.Token  // the stored token, read under the lock
	waited  time.Duration // for the lock, from the first try
	other   bool          // waited for another process's lease
	// end ends the lease this caller took to refresh current; nil when
	// current needs no refresh (or cannot have one).
	end func(release bool)
	// release frees this process's in-flight slot, held with the lease
	// until the provider answered.
	release func()
}

// claim takes a slot of this process's in-flight refreshes, then the
// connection's lock, re-reads the token and, if due still says so, leases
// its refresh and commits. While another process's lease on the token
// runs, it lets the slot go and waits for that refresh's announcement or
// the next look, within the lock wait.
//
// The first look only tries the lock: a lock held by another transaction
// is most often another process claiming the same refresh, and waiting
// for it on a pool connection is how processes that meet many stale
// connections at once would walk through them in step, each waiting for
// the others' locks. The caller waits for the holder with no connection
// held, then looks again, waiting for the lock this time (in the order
// Postgres queues its waiters).
func (u *RefreshTokenUseCase) claim(ctx context.Context, connection string, forced bool, due func(domain.Token) bool, seen domain.Token) (claimed, error) {
	var (
		asked  time.Time
		c      claimed
		bid    = u.bidFor(seen, forced, due)
		leased error // the last look found another process's lease
		// waiting is the lock wait's span, from the first try (or the
		// lease that sent the last one away) until the lock is held.
		waiting Span
	)
	held := func(err error) {
		if waiting != nil {
			waiting.End(Facts{Waited: leased != nil}, err)
			waiting = nil
		}
	}
	for look := 0; ; look++ {
		woken, unwatch := u.announced.watch(connection)
		ts := time.Now()
		if err := u.acquireSlot(ctx, woken); err != nil {
			unwatch()
			if errors.Is(err, errAnnounced) {
				// Another process stored the token while this one queued.
				t, done, err := u.lookAgain(ctx, connection, ts, due)
				if err != nil || done {
					held(err)
					return claimed{current: t, waited: time.Since(ts), other: true}, err
				}
				bid = u.bidFor(t, forced, due)
				continue
			}
			held(err)
			return c, err
		}
		if asked.IsZero() {
			asked = time.Now() // the lock wait counts from here, not the queue for a slot
		}
		wait := u.opts.LockWait - time.Since(asked)
		if leased != nil && wait <= 0 {
			u.slots.Release(1)
			unwatch()
			err := fmt.Errorf("%w: %w", domain.ErrLockTimeout, leased)
			held(err)
			return c, err
		}
		if waiting == nil {
			_, waiting = u.opts.Tracer.Start(ctx, StepLockWait, connection)
		}
		next, err := u.tryClaim(ctx, connection, forced, due, wait, look == 0, held, bid)
		if errors.Is(err, ErrBidMissed) {
			// The token stored was not the one bid for: look again at
			// once, without a bid.
			u.slots.Release(1)
			unwatch()
			bid = nil
			continue
		}
		if errors.Is(err, errLockHeld) {
			held(nil) // taken by another: no failure of the step
		} else {
			held(err) // the lock was never held
		}
		next.waited, next.other = time.Since(asked), leased != nil
		if next.end != nil {
			next.release = sync.OnceFunc(func() { u.slots.Release(1) })
		} else {
			u.slots.Release(1)
		}
		if !errors.Is(err, domain.ErrRefreshInProgress) {
			unwatch()
			return next, err
		}
		c, leased = next, err
		c.other = true
		_, waiting = u.opts.Tracer.Start(ctx, StepLockWait, connection)
		poll := u.leasePoll()
		if errors.Is(err, errLockHeld) {
			poll = lockHeldPoll
		}
		_, err = u.awaitLease(ctx, asked, woken, poll, err)
		unwatch()
		if err != nil {
			held(err)
			return c, err
		}
		// Most likely the holder stored the rotated token, or is refreshing
		// it: plain reads say which, without the lock.
		t, done, err := u.lookAgain(ctx, connection, asked, due)
		bid = u.bidFor(t, forced, due)
		switch {
		case done:
			held(nil)
			return claimed{current: t, waited: time.Since(asked), other: true}, nil
		case errors.Is(err, errAnswerPending):
			held(nil)
			return claimed{current: t, waited: time.Since(asked), other: true}, err
		case err != nil:
			err = fmt.Errorf("%w: %w", domain.ErrLockTimeout, leased)
			held(err)
			return c, err
		}
	}
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

// lookAgain reads connection's token without the lock after a wait for
// another holder. It is done when the token needs no refresh any more
// (or cannot have one). While another process's lease on it runs, it
// waits for that refresh's announcement, reading again (no lock, no slot)
// at each poll, until the lock wait that began at asked is over (an error
// that is also a lock timeout).
func (u *RefreshTokenUseCase) lookAgain(ctx context.Context, connection string, asked time.Time, due func(domain.Token) bool) (domain.Token, bool, error) {
	for {
		woken, unwatch := u.announced.watch(connection)
		readCtx, cancel := context.WithTimeout(ctx, u.opts.WriteTimeout)
		t, lease, err := u.store.GetWithLease(readCtx, connection)
		cancel()
		switch {
		case err != nil:
			unwatch()
			return t, false, nil // the lock's look says more
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
		case u.overdue(lease):
			unwatch()
			return t, false, u.answerPending(lease)
		}
		_, err = u.awaitLease(ctx, asked, woken, u.leasePoll(), domain.ErrRefreshInProgress)
		unwatch()
		if err != nil {
			return t, false, err
		}
	}
}

// errLockHeld: the lock was taken by another transaction when claim only
// tried it.
var errLockHeld = fmt.Errorf("lock held by another transaction: %w", domain.ErrRefreshInProgress)

// bidFor is the lease bid for a refresh of seen, the token last seen due,
// or nil where the lease is taken after the re-read: a forced refresh, a
// token with a failure on record or at a paused provider (the re-read
// decides), or none seen.
func (u *RefreshTokenUseCase) bidFor(seen domain.Token, forced bool, due func(domain.Token) bool) *LeaseBid {
	if forced || seen.Version == 0 || seen.Status == domain.StatusNeedsReauth || seen.Failure.Failures > 0 || !due(seen) ||
		u.gate.of(seen.Provider).check(u.opts.Clock.Now()) != nil || u.hung.of(seen.Provider).check(u.opts.Clock.Now()) != nil {
		return nil
	}
	return &LeaseBid{Version: seen.Version, Call: u.opts.AnswerDeadline}
}

// tryClaim is claim's transaction, waiting at most wait for the lock, or
// not at all with now (errLockHeld when another transaction holds it);
// held is called once the lock is. With now and bid, the lease is asked
// for with the lock (TokenStore.ClaimInLock).
func (u *RefreshTokenUseCase) tryClaim(ctx context.Context, connection string, forced bool, due func(domain.Token) bool,
	wait time.Duration, now bool, held func(error), bid *LeaseBid) (claimed, error) {
	var c claimed
	fn := func(txCtx context.Context, s LockedStore) error {
		held(nil)
		// The re-read is also the liveness check of the transaction: it
		// runs right before the lease is taken.
		t, err := u.reread(txCtx, s, connection)
		if err != nil {
			return err
		}
		c.current = t
		if t.Status == domain.StatusNeedsReauth || !due(t) {
			return nil // refreshed by another process meanwhile, or dead
		}
		if err := u.gate.of(t.Provider).check(u.opts.Clock.Now()); err != nil {
			return err
		}
		if err := u.hung.of(t.Provider).check(u.opts.Clock.Now()); err != nil {
			return err
		}
		if err := checkFailure(t, u.opts.Clock.Now()); err != nil {
			return err
		}
		if forced && !u.forced.allow(connection, u.opts.Clock.Now(), u.forceGap(t)) {
			return domain.ErrRefreshRateLimited
		}
		// Last chance to give up: past this point the refresh token is
		// about to be spent, and the new one must reach the database
		// whatever the caller does.
		if err := ctx.Err(); err != nil {
			return err
		}
		c.end, err = u.lease(txCtx, s, t)
		return err
	}
	var (
		locked bool
		err    error
	)
	switch {
	case !now:
		return c, u.store.InLock(ctx, connection, wait, u.opts.WriteTimeout, fn)
	case bid != nil:
		locked, err = u.store.ClaimInLock(ctx, connection, u.opts.WriteTimeout, *bid, fn)
	default:
		locked, err = u.store.TryInLock(ctx, connection, u.opts.WriteTimeout, fn)
	}
	if err == nil && !locked {
		err = errLockHeld
	}
	return c, err
}

// reread is the read under the lock, traced.
func (u *RefreshTokenUseCase) reread(ctx context.Context, s LockedStore, connection string) (domain.Token, error) {
	_, span := u.opts.Tracer.Start(ctx, StepReread, connection)
	t, err := s.Get(ctx, connection)
	span.End(Facts{Provider: t.Provider, OldVersion: t.Version}, err)
	return t, err
}

// lease takes t's refresh lease and commits, traced. Another process's
// lease is no failure of the step: the caller waits for it.
func (u *RefreshTokenUseCase) lease(ctx context.Context, s LockedStore, t domain.Token) (func(bool), error) {
	_, span := u.opts.Tracer.Start(ctx, StepLease, t.Connection)
	end, err := s.Lease(ctx, t, u.opts.AnswerDeadline)
	other := errors.Is(err, domain.ErrRefreshInProgress) || errors.Is(err, ErrBidMissed)
	spanErr := err
	if other {
		spanErr = nil
	}
	span.End(Facts{Provider: t.Provider, OldVersion: t.Version, Waited: other}, spanErr)
	return end, err
}

// Waits for another holder: the next look comes at its announcement (the
// change listener), or after leasePoll, or after leasePollListening while
// the listener is connected (announcements then come; the look is for a
// holder that died, whose lease runs out a second after its last
// renewal), or after lockHeldPoll when the lock was taken (its holder's
// transaction is short, and may end without an announcement).
const (
	leasePoll          = 100 * time.Millisecond
	leasePollListening = time.Second
	lockHeldPoll       = 5 * time.Millisecond
)

// leasePoll is the wait between two looks at a leased connection.
func (u *RefreshTokenUseCase) leasePoll() time.Duration {
	if u.cache.trusted.Load() {
		return leasePollListening
	}
	return leasePoll
}

// awaitLease waits, at most poll, before the next look at a connection
// whose refresh another holder has (leased wraps
// domain.ErrRefreshInProgress), and reports whether an announcement woke
// it. It gives up, with an error that is also a lock timeout, when the
// lock wait that began at asked is over.
func (u *RefreshTokenUseCase) awaitLease(ctx context.Context, asked time.Time, woken <-chan struct{}, poll time.Duration, leased error) (bool, error) {
	left := u.opts.LockWait - time.Since(asked)
	if left <= 0 {
		return false, fmt.Errorf("%w: %w", domain.ErrLockTimeout, leased)
	}
	t := time.NewTimer(min(poll, left))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false, fmt.Errorf("%w (%w)", ctx.Err(), leased)
	case <-woken:
		return true, nil
	case <-t.C:
		return false, nil
	}
}

// resolve spends the refresh token of the token c leased at the provider,
// with no database connection held, and keeps the outcome: the rotated
// token, or needs_reauth for a dead grant. A failure that leaves the grant
// alive (provider unavailable, client rejected, endpoint wrong) ends the
// lease and is returned; the stored token is untouched. A dead grant is
// stored as needs_reauth and returned as revoked, with a nil error. A
// version whose last answer was lost is presented again only once the
// provider answers a probe.
//
// The call and the write run to the end whatever the caller does: the
// refresh token is spent once it is sent, and its answer is awaited until
// the answer deadline.
func (u *RefreshTokenUseCase) resolve(ctx context.Context, store locker, c claimed) (redeemed, error) {
	t := c.current
	r := redeemed{from: t.RefreshToken}
	if t.Failure.ProbeFirst() {
		if err := u.probe(ctx, t.Provider); err != nil {
			c.release()
			u.recordFailure(ctx, store, c, &domain.ProviderError{Lost: true, Err: err})
			return r, err
		}
	}
	callCtx, cancel := context.WithTimeout(ctx, u.opts.AnswerDeadline)
	callCtx, span := u.opts.Tracer.Start(callCtx, StepProvider, t.Connection)
	settings := u.gate.of(t.Provider).settings() // the provider's settings the call goes out with
	called := time.Now()
	g, err := u.refresher.Refresh(callCtx, t.Provider, t.RefreshToken)
	r.latency = time.Since(called)
	span.End(Facts{Provider: t.Provider, OldVersion: t.Version, Outcome: providerOutcome(err)}, err)
	cancel()
	// The slot bounds the calls at the provider: the next one may start
	// while this answer is written.
	c.release()
	if answered(err) {
		u.hung.of(t.Provider).accept()
	}
	switch {
	case err == nil:
		u.gate.of(t.Provider).accept()
		next := t.Rotated(g, u.opts.Clock.Now())
		r.rotated = &next
		r.tok, err = u.keep(ctx, store, r, c.end)
		return r, err
	case clientSide(err):
		c.end(true)
		u.clientFailed(t, settings, err)
		return r, err
	}
	if pe, ok := paced(err); ok {
		u.recordFailure(ctx, store, c, pe)
		return r, err
	}
	switch {
	case !errors.Is(err, domain.ErrGrantRevoked):
		c.end(true)
		return r, err
	}
	defer c.end(false)
	// Before declaring the grant dead, look again under the lock: a token
	// stored since we read (a rotated token written late by its redeemer, a
	// new grant) means this rejection is stale news.
	rejected := err
	var marked domain.Token
	commitCtx, span := u.opts.Tracer.Start(ctx, StepCommit, t.Connection)
	err = store.InLock(commitCtx, t.Connection, u.opts.LockWait, u.opts.WriteTimeout, func(txCtx context.Context, s LockedStore) error {
		now, err := s.Get(txCtx, t.Connection)
		if err != nil {
			return err
		}
		if now.Version != t.Version && now.Status == domain.StatusActive {
			r.tok = now
			return nil
		}
		// Permanent: record it (keeping the refresh token for forensics)
		// so that no process redeems it again.
		dead := t
		// rolled_back when the store went back behind a version this
		// process knew (a failover lost the rotated token).
		dead.Status, dead.StatusReason = domain.StatusNeedsReauth, u.reasonFor(dead, rejected)
		r.reason = dead.StatusReason
		marked, err = s.Save(txCtx, dead)
		return err
	})
	facts := Facts{Provider: t.Provider, OldVersion: t.Version, NewVersion: marked.Version, Outcome: OutcomeInvalidGrant}
	if r.tok.Version != 0 {
		facts.NewVersion, facts.Outcome = r.tok.Version, OutcomeSkippedFresh // stale news: a newer token was stored
	}
	span.End(facts, err)
	if err != nil {
		return r, errors.Join(rejected, err)
	}
	if r.tok.Version == 0 {
		r.revoked = fmt.Errorf("%w: %w", domain.ErrNeedsReauth, rejected)
	}
	return r, nil
}

// keep writes a rotated token under the connection's lock, if the stored
// token is still the one it was rotated from, and ends its lease. A failed
// write is retried in fresh transactions for RescueWindow; keep gives up
// early only when another token was stored meanwhile (then the rotated one
// is obsolete, and that is said loudly too).
//
// One exception: when this process's lease ran out while it was at the
// provider (it could not renew it), another process may have redeemed the
// same refresh token, been told invalid_grant, and marked the connection
// needs_reauth. If the stored refresh token is still the spent one, the
// rotated token is the only live token of the grant (unless the provider
// revoked the whole grant for that reuse, which the next refresh will
// tell): it is stored.
func (u *RefreshTokenUseCase) keep(ctx context.Context, store locker, r redeemed, end func(release bool)) (domain.Token, error) {
	defer end(false)
	rotated := *r.rotated
	log := u.opts.Logger.With("connection", rotated.Connection, "from_version", rotated.Version)
	attempt := func() (domain.Token, error) {
		var out domain.Token
		err := store.InLock(ctx, rotated.Connection, u.opts.LockWait, u.opts.WriteTimeout, func(txCtx context.Context, s LockedStore) error {
			now, err := s.Get(txCtx, rotated.Connection)
			if err != nil {
				return err
			}
			if now.Version > rotated.Version && now.RefreshToken.Equal(rotated.RefreshToken) {
				// An earlier write had in fact gone through (its answer
				// was lost): the rotated token is stored.
				out = now
				return nil
			}
			next := rotated
			switch {
			case now.Version == rotated.Version:
			case now.Status == domain.StatusNeedsReauth && now.RefreshToken.Equal(r.from):
				log.Error("connection was marked needs_reauth by a process that presented the refresh token this one had already rotated; storing the rotated token instead",
					"stored_version", now.Version, "reason", now.StatusReason)
				next.Version = now.Version
			default:
				return backoff.Permanent(fmt.Errorf("%w: stored version is %d", domain.ErrConflict, now.Version))
			}
			out, err = s.Save(txCtx, next)
			return err
		})
		return out, err
	}
	facts := Facts{Provider: rotated.Provider, OldVersion: rotated.Version}
	done := func(span Span, out domain.Token, err error) {
		f := facts
		if err == nil {
			f.NewVersion, f.Outcome = out.Version, OutcomeOK
		}
		span.End(f, err)
	}
	// The common case in one round trip: nothing was stored meanwhile.
	commitCtx, span := u.opts.Tracer.Start(ctx, StepCommit, rotated.Connection)
	writeCtx, cancel := context.WithTimeout(commitCtx, u.opts.WriteTimeout)
	out, cause := store.SaveLocked(writeCtx, u.opts.LockWait, rotated)
	cancel()
	if errors.Is(cause, domain.ErrConflict) {
		out, cause = attempt() // why not: look under the lock
	}
	done(span, out, cause)
	if cause == nil {
		return out, nil
	}
	log.Error("rotated refresh token not persisted; retrying the write", "err", cause)
	ctx, rescue := u.opts.Tracer.Start(ctx, StepRescue, rotated.Connection)
	ctx, cancel = context.WithTimeout(ctx, u.opts.RescueWindow)
	defer cancel()
	policy := backoff.NewExponentialBackOff()
	policy.InitialInterval, policy.MaxInterval = 50*time.Millisecond, time.Second
	var permanent *backoff.PermanentError
	if !errors.As(cause, &permanent) {
		out, cause = backoff.Retry(ctx, func() (domain.Token, error) {
			out, err := attempt()
			if err != nil {
				log.Error("rotated refresh token still not persisted", "err", err)
			}
			return out, err
		}, backoff.WithBackOff(policy), backoff.WithMaxElapsedTime(u.opts.RescueWindow))
		if cause == nil {
			log.Warn("rotated refresh token persisted on retry", "version", out.Version)
			done(rescue, out, nil)
			return out, nil
		}
	}
	done(rescue, out, cause)
	log.Error("rotated refresh token dropped", "err", cause)
	return domain.Token{}, fmt.Errorf("persist rotated token: %w", cause)
}

// stale is the due rule of Token: the skew rule says refresh.
func (u *RefreshTokenUseCase) stale(t domain.Token) bool {
	return !t.FreshAt(u.opts.Clock.Now(), u.skewOf(t))
}

// locker takes a connection's lock: the TokenStore, or a sweep's store.
type locker interface {
	InLock(ctx context.Context, connection string, wait, hold time.Duration,
		fn func(ctx context.Context, s LockedStore) error) error
	SaveLocked(ctx context.Context, wait time.Duration, t domain.Token) (domain.Token, error)
}

// redeemed is what spending a refresh token led to.
type redeemed struct {
	tok     domain.Token  // the stored token afterwards
	from    domain.Secret // the refresh token spent
	rotated *domain.Token // the provider's answer, as soon as there is one, written or not
	revoked error         // the grant is dead: stored as needs_reauth
	reason  string        // why, as stored
	latency time.Duration // of the provider call
}

// providerOutcome names how a provider call ended, for its span.
func providerOutcome(err error) RefreshOutcome {
	if errors.Is(err, domain.ErrGrantRevoked) {
		return OutcomeInvalidGrant
	}
	return outcome(err)
}

// clientSide reports whether err says the client or its configuration is
// wrong, not the grant: the refresh token was not spent and no connection
// is touched.
func clientSide(err error) bool {
	return errors.Is(err, domain.ErrClientRejected) || errors.Is(err, domain.ErrEndpointMisconfigured)
}

// untouched reports whether err left the grant and the stored token as
// they were, so that a still-valid access token may be served through it.
func untouched(err error) bool {
	return errors.Is(err, domain.ErrProviderUnavailable) || errors.Is(err, domain.ErrRefreshInProgress) || clientSide(err)
}

// clientFailed closes the client gate of t's provider and tells
// operators, at most once a minute per connection, which setting to check.
func (u *RefreshTokenUseCase) clientFailed(t domain.Token, settings uint64, err error) {
	now := u.opts.Clock.Now()
	u.gate.of(t.Provider).reject(now, settings, err)
	if !u.errorLines.allow(t.Connection, now, errorLineEvery) {
		return
	}
	check, msg := "OAUTH_CLIENT_ID, OAUTH_CLIENT_SECRET, OAUTH_AUTH_STYLE", "the token endpoint rejected the client; connection kept active, its token untouched"
	if errors.Is(err, domain.ErrEndpointMisconfigured) {
		check, msg = "OAUTH_TOKEN_URL", "the token URL does not answer as a token endpoint; connection kept active, its token untouched"
	}
	if t.Provider != "" {
		check = "tokenctl provider update " + t.Provider
	}
	u.opts.Logger.Error(msg, "connection", t.Connection, "provider", t.Provider, "check", check, "err", err)
}

// errorLineEvery spaces the ERROR lines about a rejected client per
// connection.
const errorLineEvery = time.Minute

// forceGap is the least time between two forced refreshes of t's
// connection in this process: ForceInterval, or half the lifetime the
// provider granted t if that is shorter, so that a token that lives less
// than ForceInterval can still be replaced after every 401.
func (u *RefreshTokenUseCase) forceGap(t domain.Token) time.Duration {
	life := t.Expiry.Sub(t.ObtainedAt)
	if t.Expiry.IsZero() || t.ObtainedAt.IsZero() || life <= 0 {
		return u.opts.ForceInterval
	}
	return min(u.opts.ForceInterval, life/2)
}

// usable reports whether t is active and not expired at now (the skew
// aside).
func usable(t domain.Token, now time.Time) bool {
	return t.Status == domain.StatusActive && !t.AccessToken.IsZero() && (t.Expiry.IsZero() || now.Before(t.Expiry))
}

func needsReauth(t domain.Token) error {
	if t.StatusReason == "" {
		return domain.ErrNeedsReauth
	}
	return fmt.Errorf("%w (%s)", domain.ErrNeedsReauth, t.StatusReason)
}

// reason is what operators see about a rejected grant: the OAuth2 error
// code, never a response body.
func reason(err error) string {
	var pe *domain.ProviderError
	if errors.As(err, &pe) && pe.Code != "" {
		return pe.Code
	}
	return "grant rejected"
}
