package usecase

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v5"

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

	gate       clientGates // per provider: pauses its calls after it rejected the client
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
		forced: throttle{keep: opts.ForceInterval}, errorLines: throttle{keep: errorLineEvery}}
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
func (u *RefreshTokenUseCase) Token(ctx context.Context, connection string) (domain.Token, error) {
	s, state := u.cache.get(connection, u.opts.Clock.Now())
	u.opts.Observer.CacheLookup(state == hit)
	if state == hit {
		return s.tok, nil
	}
	fl, err := u.await(ctx, connection, state == stale)
	if err != nil {
		return domain.Token{}, err
	}
	return withoutRefreshToken(fl.tok), nil
}

// withoutRefreshToken is what callers get: the refresh token is spent only
// under the connection's lock, and a caller that had it could spend it
// outside.
func withoutRefreshToken(t domain.Token) domain.Token {
	t.RefreshToken = domain.Secret{}
	return t
}

// await is Token's slow path: it joins (or starts) the connection's flight
// and waits for it.
func (u *RefreshTokenUseCase) await(ctx context.Context, connection string, knownStale bool) (*flight, error) {
	fl, err := u.flights.do(ctx, connection, u.flightLimit(), func(ctx context.Context) (domain.Token, error) {
		return u.load(ctx, connection, knownStale)
	})
	if err == nil {
		err = fl.err
	}
	if err != nil {
		return nil, fmt.Errorf("token for %s: %w", connection, err)
	}
	return fl, nil
}

// Invalidate tells the use case that another process stored version of
// connection's token; any older cached copy is dropped.
func (u *RefreshTokenUseCase) Invalidate(connection string, version int64) {
	u.opts.Observer.Invalidated()
	u.cache.invalidate(connection, version)
}

// TrustCache turns the in-process cache on while the caller guarantees
// Invalidate is called for every change committed by other processes (the
// change listener is connected), and off when it no longer can. Either call
// forgets everything cached so far.
func (u *RefreshTokenUseCase) TrustCache(trusted bool) {
	u.cache.setTrusted(trusted)
}

// flightLimit bounds one slow path: a lock wait, a provider call, a write.
func (u *RefreshTokenUseCase) flightLimit() time.Duration {
	return u.opts.LockWait + u.opts.RefreshTimeout + 2*u.opts.WriteTimeout
}

// load reads the stored token and refreshes it if it is stale. When the
// cache already knows the current token is stale, the read outside the lock
// is skipped: the refresh re-reads inside it anyway.
func (u *RefreshTokenUseCase) load(ctx context.Context, connection string, knownStale bool) (domain.Token, error) {
	epoch := u.cache.begin()
	if !knownStale {
		t, err := u.store.Get(ctx, connection)
		if err != nil {
			return domain.Token{}, err
		}
		if t.Status == domain.StatusNeedsReauth {
			return domain.Token{}, needsReauth(t)
		}
		if t.FreshAt(u.opts.Clock.Now(), u.skewOf(t)) {
			u.cache.put(t, epoch, u.skewOf(t))
			return t, nil
		}
	}
	t, err := u.refresh(ctx, connection, false, u.stale)
	if err != nil {
		return domain.Token{}, fmt.Errorf("refresh: %w", err)
	}
	u.cache.put(t, epoch, u.skewOf(t))
	return t, nil
}

// refresh takes the lock, re-reads, and redeems the refresh token only if
// the stored token is still due (nobody refreshed it meanwhile).
//
// The rotation window: between the provider's answer and the commit, the
// new refresh token exists only here, and the old one is already dead. If
// that write or commit fails (the database connection dropped, the commit
// failed), refresh keeps the rotated token and retries writing it in fresh
// transactions for RescueWindow, logging loudly, instead of dropping it.
func (u *RefreshTokenUseCase) refresh(ctx context.Context, connection string, forced bool, due func(domain.Token) bool) (domain.Token, error) {
	var (
		out     domain.Token
		r       redeemed
		current domain.Token // the stored token, as read under the lock
	)
	ev := RefreshEvent{Connection: connection, Forced: forced}
	asked := time.Now()
	// settled says the stored token, as read under the lock, needs nothing
	// more: another process refreshed it while we waited, or it cannot be
	// refreshed (needs_reauth). settle makes it the outcome.
	settled := func(t domain.Token) bool { return t.Status == domain.StatusNeedsReauth || !due(t) }
	settle := func(t domain.Token) error {
		ev.LockWait, current, ev.OldVersion = time.Since(asked), t, t.Version
		if t.Status == domain.StatusNeedsReauth {
			return needsReauth(t)
		}
		out, ev.Outcome = t, OutcomeSkippedFresh
		return nil
	}
	locked := func(txCtx context.Context, s LockedStore) error {
		// The re-read is also the liveness check of the transaction: it
		// runs right before the refresh token is spent.
		t, err := s.Get(txCtx, connection)
		if err != nil {
			return err
		}
		if settled(t) {
			return settle(t)
		}
		ev.LockWait, current, ev.OldVersion = time.Since(asked), t, t.Version
		if err := u.gate.of(t.Provider).check(u.opts.Clock.Now()); err != nil {
			return err
		}
		if forced && !u.forced.allow(connection, u.opts.Clock.Now(), u.forceGap(t)) {
			return domain.ErrRefreshRateLimited
		}
		// Last chance to give up: past this point the refresh token is
		// spent, and the new one must reach the database whatever the
		// caller does, so the rest runs under txCtx.
		if err := ctx.Err(); err != nil {
			return err
		}
		r, err = u.redeem(txCtx, s, t)
		out = r.tok
		return err
	}
	held, done, err := u.store.InLockUnless(ctx, connection, u.opts.LockWait, u.hold(), settled, locked)
	for err != nil && errors.Is(err, domain.ErrRefreshInProgress) {
		// A holder that lost the lock may still be at the provider with
		// this refresh token, or storing what it answered: wait for it
		// rather than present the token a second time.
		if err = u.awaitLease(ctx, asked, err); err != nil {
			break
		}
		held, done, err = u.store.InLockUnless(ctx, connection, u.opts.LockWait, u.hold(), settled, locked)
	}
	if done {
		err = settle(held)
	}
	if ev.LockWait == 0 {
		ev.LockWait = time.Since(asked) // never got the lock
	}
	ev.ProviderLatency = r.latency
	switch {
	case err != nil && r.rotated != nil:
		out, err = u.rescue(connection, r, err)
	case err == nil && r.revoked != nil:
		ev.Outcome, err = OutcomeInvalidGrant, r.revoked
		u.opts.Logger.Error("connection needs re-authorisation: the provider rejected its grant",
			"connection", connection, "reason", reason(r.revoked))
		u.opts.OnNeedsReauth(connection, reason(r.revoked))
	}
	var stillValid error // the failure a still-valid token is served through
	if err != nil && !forced && untouched(err) && usable(current, u.opts.Clock.Now()) {
		// The provider is down or rejects the client, but the stored token
		// has not expired yet: the skew is there for exactly this. Serve
		// it; it is not cached as fresh, so the next caller tries again.
		if errors.Is(err, domain.ErrProviderUnavailable) {
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
	ev.Provider = current.Provider
	u.observe(ev)
	if err != nil {
		return domain.Token{}, err
	}
	return out, nil
}

// rescue writes a rotated token whose first write failed: each attempt is a
// fresh transaction under the connection's lock, and stores it only if the
// stored token is still the one it was rotated from. It gives up after
// RescueWindow, or when another token was stored meanwhile (then the
// rotated one is obsolete, and that is said loudly too).
//
// One exception: when the lock was lost with the failed write, another
// process may have redeemed the refresh token this one had just spent,
// been told invalid_grant, and marked the connection needs_reauth. If the
// stored refresh token is still the spent one, the rotated token is the
// only live token of the grant (unless the provider revoked the whole
// grant for that reuse, which the next refresh will tell): it is stored.
func (u *RefreshTokenUseCase) rescue(connection string, r redeemed, cause error) (domain.Token, error) {
	if r.endLease != nil {
		defer r.endLease(false)
	}
	rotated := *r.rotated
	log := u.opts.Logger.With("connection", connection, "from_version", rotated.Version)
	log.Error("rotated refresh token not persisted; retrying the write", "err", cause)
	ctx, cancel := context.WithTimeout(context.Background(), u.opts.RescueWindow)
	defer cancel()
	policy := backoff.NewExponentialBackOff()
	policy.InitialInterval, policy.MaxInterval = 50*time.Millisecond, time.Second
	attempt := func() (domain.Token, error) {
		var out domain.Token
		err := u.store.InLock(ctx, connection, u.opts.LockWait, u.opts.WriteTimeout, func(txCtx context.Context, s LockedStore) error {
			now, err := s.Get(txCtx, connection)
			if err != nil {
				return err
			}
			if now.Version > rotated.Version && now.RefreshToken.Equal(rotated.RefreshToken) {
				// The failed commit had in fact gone through (its answer was
				// lost): the rotated token is stored.
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
		if err != nil {
			log.Error("rotated refresh token still not persisted", "err", err)
		}
		return out, err
	}
	out, err := backoff.Retry(ctx, attempt, backoff.WithBackOff(policy), backoff.WithMaxElapsedTime(u.opts.RescueWindow))
	if err != nil {
		log.Error("rotated refresh token dropped", "err", err)
		return domain.Token{}, fmt.Errorf("persist rotated token: %w (first failure: %w)", err, cause)
	}
	log.Warn("rotated refresh token persisted on retry", "version", out.Version)
	return out, nil
}

// leasePoll spaces the looks at a lease another process holds.
const leasePoll = 100 * time.Millisecond

// awaitLease waits before the next look at a connection whose refresh is
// leased by another process (leased wraps domain.ErrRefreshInProgress). It
// gives up, with an error that is also a lock timeout, when the next look
// would come after the lock wait that began at asked.
func (u *RefreshTokenUseCase) awaitLease(ctx context.Context, asked time.Time, leased error) error {
	if time.Since(asked)+leasePoll > u.opts.LockWait {
		return fmt.Errorf("%w: %w", domain.ErrLockTimeout, leased)
	}
	t := time.NewTimer(leasePoll)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("%w (%w)", ctx.Err(), leased)
	case <-t.C:
		return nil
	}
}

// hold bounds the locked part of a refresh: the provider call and the write.
func (u *RefreshTokenUseCase) hold() time.Duration {
	return u.opts.RefreshTimeout + u.opts.WriteTimeout
}

// stale is the due rule of Token: the skew rule says refresh.
func (u *RefreshTokenUseCase) stale(t domain.Token) bool {
	return !t.FreshAt(u.opts.Clock.Now(), u.skewOf(t))
}

// redeemed is what spending a refresh token led to.
type redeemed struct {
	tok     domain.Token  // the stored token afterwards
	from    domain.Secret // the refresh token spent
	rotated *domain.Token // the provider's answer, as soon as there is one, written or not
	revoked error         // the grant is dead: stored as needs_reauth, to be committed
	latency time.Duration // of the provider call
	// endLease ends the refresh's lease when the rotated token is not
	// stored yet; the rescue calls it when it is over.
	endLease func(release bool)
}

// redeem spends t's refresh token at the provider and stores the outcome
// through s, which holds the connection's lock. A failure that leaves the
// grant alive (provider unavailable, client rejected, endpoint wrong)
// returns err: roll back, the stored token is untouched. Only a dead grant
// is stored as needs_reauth and returned as revoked with a nil err, so that
// the transaction commits it.
func (u *RefreshTokenUseCase) redeem(txCtx context.Context, s LockedStore, t domain.Token) (redeemed, error) {
	r := redeemed{from: t.RefreshToken}
	// The lease outlives this transaction's session: if the session ends
	// during the call, the next lock holder waits for this refresh instead
	// of presenting the same refresh token. It lasts while a rotated token
	// is not stored yet (the rescue ends it), and is released as soon as
	// the token is known not to be spent.
	end, err := s.Lease(txCtx, t)
	if err != nil {
		return r, err
	}
	r.endLease = end
	defer func() {
		// A rotated token not stored yet keeps its lease for the rescue.
		if r.rotated == nil || r.tok.Version != 0 {
			end(r.rotated == nil)
		}
	}()
	callCtx, cancel := context.WithTimeout(txCtx, u.opts.RefreshTimeout)
	called := time.Now()
	g, err := u.refresher.Refresh(callCtx, t.Provider, t.RefreshToken)
	r.latency = time.Since(called)
	cancel()
	switch {
	case err == nil:
		u.gate.of(t.Provider).accept()
		next := t.Rotated(g, u.opts.Clock.Now())
		r.rotated = &next
		r.tok, err = s.Save(txCtx, next)
		return r, err
	case clientSide(err):
		u.clientFailed(t, err)
		return r, err
	case !errors.Is(err, domain.ErrGrantRevoked):
		return r, err
	}
	// Before declaring the grant dead, look again: a token stored since
	// we read (a rotated token written late by its redeemer, a new grant)
	// means this rejection is stale news.
	if now, getErr := s.Get(txCtx, t.Connection); getErr == nil && now.Version != t.Version && now.Status == domain.StatusActive {
		r.tok = now
		return r, nil
	}
	// Permanent: record it (keeping the refresh token for forensics) so
	// that no process redeems it again.
	t.Status = domain.StatusNeedsReauth
	t.StatusReason = reason(err)
	if _, saveErr := s.Save(txCtx, t); saveErr != nil {
		return r, errors.Join(err, saveErr)
	}
	r.revoked = fmt.Errorf("%w: %w", domain.ErrNeedsReauth, err)
	return r, nil
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
func (u *RefreshTokenUseCase) clientFailed(t domain.Token, err error) {
	now := u.opts.Clock.Now()
	u.gate.of(t.Provider).reject(now, err)
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
