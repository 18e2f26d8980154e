package usecase

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/tokenguard/tokenguard/domain"
)

// RefreshTokenUseCase hands out access tokens, refreshing each at most once per expiry however
// many callers race for it; safe for concurrent use.
type RefreshTokenUseCase struct {
	store     TokenStore
	refresher Refresher
	opts      Options
	cache     tokenCache
	flights   flights
	slots     *semaphore.Weighted // refreshes in flight in this process, queued in order
	announced announcements       // wakes the callers waiting for another process's refresh

	providers  sync.Map // name -> *providerState
	forced     throttle // connection -> last forced refresh
	errorLines throttle // connection -> last ERROR line about the client
}

// NewRefreshTokenUseCase builds the use case.
func NewRefreshTokenUseCase(store TokenStore, refresher Refresher, opts Options) (*RefreshTokenUseCase, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	u := &RefreshTokenUseCase{store: store, refresher: refresher, opts: opts, flights: flights{log: opts.Logger},
		slots:  semaphore.NewWeighted(int64(opts.MaxRefreshesInFlight)),
		forced: throttle{keep: opts.ForceInterval}, errorLines: throttle{keep: errorLineEvery}}
	u.cache.capacity, u.cache.clock = int64(max(opts.CacheSize, 0)), opts.Clock
	return u, nil
}

// Token returns a token for connection valid for at least the skew, without its refresh token;
// errors wrap domain's typed errors or ctx's. The path fits a new goroutine's first stack, as
// hundreds arrive at an expiry (TestWaitersFitTheirFirstStack).
func (u *RefreshTokenUseCase) Token(ctx context.Context, connection string) (t domain.Token, err error) {
	s, state := u.cache.get(connection, u.opts.Clock.Now())
	u.opts.Observer.CacheLookup(state == hit)
	if state == hit {
		return s.tok, nil
	}
	ctx, span := u.opts.Tracer.Start(ctx, StepToken, connection)
	if err = ctx.Err(); err != nil {
		_, err = endToken(span, connection, nil, err)
		return t, err
	}
	fl := u.flights.join(ctx, connection, func(ctx context.Context) (domain.Token, error) {
		return u.load(ctx, connection, s) // s: nil, or the cached token known to be stale
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
	t.RefreshToken = domain.Secret{} // a caller holding it could spend it outside the connection's lock
	return t, nil
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

// ForceRefresh returns a token newer than version failed, answered 401: the stored one, or one
// refreshed now if failed is still stored (a burst of 401s causes one refresh), without its refresh
// token. Refreshes that call the provider are limited per connection (domain.ErrRefreshRateLimited).
func (u *RefreshTokenUseCase) ForceRefresh(ctx context.Context, connection string, failed int64) (domain.Token, error) {
	u.opts.Observer.ForcedRefresh(connection)
	u.cache.invalidate(connection, failed+1) // never hand out the failed token again
	key := connection + "\x00" + strconv.FormatInt(failed, 10)
	ctx, span := u.opts.Tracer.Start(ctx, StepToken, connection)
	fl, err := u.flights.do(ctx, key, func(ctx context.Context) (domain.Token, error) {
		epoch := u.cache.begin()
		due := func(t domain.Token) bool { return t.Version == failed }
		// A refresh under way brings the newer token: look waits for it.
		t, _, err := u.look(ctx, connection, time.Now(), due, true, nil)
		if err != nil {
			return domain.Token{}, err
		}
		if t.Status == domain.StatusNeedsReauth {
			return domain.Token{}, needsReauth(t)
		}
		if due(t) {
			if t, err = u.refresh(ctx, connection, true, due, t); err != nil {
				return domain.Token{}, fmt.Errorf("forced refresh: %w", err)
			}
		}
		u.cache.put(t, epoch, u.skewOf(t))
		return t, nil
	})
	if err == nil {
		err = fl.err
	}
	if err != nil {
		span.End(Facts{Forced: true, OldVersion: failed}, err)
		return domain.Token{}, fmt.Errorf("token for %s after version %d failed: %w", connection, failed, err)
	}
	span.End(Facts{Forced: true, Provider: fl.tok.Provider, OldVersion: failed, NewVersion: fl.tok.Version}, nil)
	t := fl.tok
	t.RefreshToken = domain.Secret{}
	return t, nil
}

// Invalidate drops cached copies of connection's token older than version, stored by another process.
func (u *RefreshTokenUseCase) Invalidate(connection string, version int64) {
	u.opts.Observer.Invalidated()
	u.cache.knew(connection, version, true)
	u.cache.invalidate(connection, version)
	u.announced.announce(connection)
}

// TrustCache turns the cache on while Invalidate hears every change other processes commit, and
// off when not; either call forgets what was cached.
func (u *RefreshTokenUseCase) TrustCache(trusted bool) {
	u.cache.setTrusted(trusted)
}

// load reads the stored token and refreshes it if stale; a token the cache knows stale (cached) is
// not read again outside the lock. Waiting for another holder's lease there is traced as a lock wait.
func (u *RefreshTokenUseCase) load(ctx context.Context, connection string, cached *snapshot) (domain.Token, error) {
	epoch := u.cache.begin()
	var seen domain.Token
	if cached != nil {
		seen = cached.tok
	} else {
		var span Span
		t, done, err := u.look(ctx, connection, time.Now(), u.stale, false, func() {
			_, span = u.opts.Tracer.Start(ctx, StepLockWait, connection)
		})
		if span != nil {
			span.End(Facts{Waited: true}, err)
		}
		if errors.Is(err, errAnswerPending) && usable(t, u.opts.Clock.Now()) {
			return t, nil // served, not cached: the next caller looks again
		}
		if err == nil && t.Status == domain.StatusNeedsReauth {
			err = needsReauth(t)
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
	if cached != nil && t.Version == cached.tok.Version && t.Status == cached.tok.Status && t.Failure.Failures == cached.tok.Failure.Failures {
		// The cached token itself, served still valid without a read.
		return t, nil
	}
	u.cache.put(t, epoch, u.skewOf(t))
	return t, nil
}

// refresh redeems connection's refresh token if the stored token is still due, holding no database
// connection while the provider answers: claim (lease under the lock), redeem (the provider call),
// keep (the fenced write).
func (u *RefreshTokenUseCase) refresh(ctx context.Context, connection string, forced bool, due func(domain.Token) bool, seen domain.Token) (domain.Token, error) {
	var out domain.Token
	var r redeemed
	ctx, span := u.opts.Tracer.Start(ctx, StepRefresh, connection)
	ev := RefreshEvent{Connection: connection, Forced: forced}
	c, err := u.claim(ctx, connection, forced, due, seen)
	current := c.Token // the stored token, as last read
	ev.LockWait, ev.OldVersion, ev.Provider = c.waited, current.Version, current.Provider
	switch {
	case err != nil:
	case c.End == nil && current.Status == domain.StatusNeedsReauth:
		err = needsReauth(current)
	case c.End == nil:
		out, ev.Outcome = current, OutcomeSkippedFresh
	default:
		r, err = u.redeem(ctx, u.store, c)
		out = r.tok
	}
	err = u.redeemEnded(&ev, r, err, u.opts.Logger.With("connection", connection))
	ev.Err = err // also when a still-valid token is served through it
	if err != nil && !forced && untouched(err) && usable(current, u.opts.Clock.Now()) {
		// The skew is there for this: serve the unexpired token, uncached.
		if errors.Is(err, domain.ErrProviderUnavailable) && !errors.Is(err, domain.ErrRefreshFailing) {
			u.opts.Logger.Warn("token refresh failed; serving the current token until it expires",
				"connection", connection, "version", current.Version,
				"expires_in", current.Expiry.Sub(u.opts.Clock.Now()).Round(time.Millisecond), "err", err)
		}
		out, err = current, nil
	}
	ev.Outcome, ev.NewVersion = cmp.Or(ev.Outcome, outcome(ev.Err)), out.Version
	u.observe(ev)
	span.End(ev.facts(c.other), ev.Err)
	if err != nil {
		return domain.Token{}, err
	}
	return out, nil
}

// stale is Token's due rule: the skew rule says refresh.
func (u *RefreshTokenUseCase) stale(t domain.Token) bool {
	return !t.FreshAt(u.opts.Clock.Now(), u.skewOf(t))
}

// redeemed is what spending a refresh token led to.
type redeemed struct {
	tok     domain.Token  // the stored token afterwards
	revoked error         // the grant is dead: stored as needs_reauth
	reason  string        // why, as stored
	latency time.Duration // of the provider call
}

// clientSide: the client or its configuration is wrong, not the grant; the refresh token was not spent.
func clientSide(err error) bool {
	return errors.Is(err, domain.ErrClientRejected) || errors.Is(err, domain.ErrEndpointMisconfigured)
}

// untouched: err left the grant and stored token as they were: a valid access token may be served.
func untouched(err error) bool {
	return errors.Is(err, domain.ErrProviderUnavailable) || errors.Is(err, domain.ErrRefreshInProgress) ||
		errors.Is(err, domain.ErrTokenBudgetSpent) || clientSide(err)
}

// clientFailed closes t's provider's client gate and tells operators (once a minute a connection) what to check.
func (u *RefreshTokenUseCase) clientFailed(t domain.Token, settings uint64, err error) {
	now := u.opts.Clock.Now()
	u.provider(t.Provider).gate.reject(now, settings, err)
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

const errorLineEvery = time.Minute

// usable reports whether t is active and unexpired at now (skew aside).
func usable(t domain.Token, now time.Time) bool {
	return t.Status == domain.StatusActive && !t.AccessToken.IsZero() && (t.Expiry.IsZero() || now.Before(t.Expiry))
}

func needsReauth(t domain.Token) error {
	if t.StatusReason == "" {
		return domain.ErrNeedsReauth
	}
	return fmt.Errorf("%w (%s)", domain.ErrNeedsReauth, t.StatusReason)
}
