package usecase

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// Options tune RefreshTokenUseCase. Zero values take the defaults.
type Options struct {
	// Skew: a token is refreshed once it is within Skew of its expiry
	// (default 30s), capped at half the lifetime the provider granted.
	Skew time.Duration
	// LockWait bounds the wait for another process's refresh (default 15s).
	LockWait time.Duration
	// RefreshTimeout bounds one provider call (default 10s). It must be
	// shorter than LockWait, so that a process waiting behind a refresh
	// outlasts it and then finds the new token instead of timing out.
	RefreshTimeout time.Duration
	// WriteTimeout bounds persisting the rotated token after the provider
	// answered (default 5s).
	WriteTimeout time.Duration
	// Clock defaults to the system clock.
	Clock Clock
}

// Defaults.
const (
	DefaultSkew           = 30 * time.Second
	DefaultLockWait       = 15 * time.Second
	DefaultRefreshTimeout = 10 * time.Second
	DefaultWriteTimeout   = 5 * time.Second
)

func (o Options) withDefaults() (Options, error) {
	if o.Skew == 0 {
		o.Skew = DefaultSkew
	}
	if o.LockWait == 0 {
		o.LockWait = DefaultLockWait
	}
	if o.RefreshTimeout == 0 {
		o.RefreshTimeout = min(DefaultRefreshTimeout, o.LockWait*2/3)
	}
	if o.WriteTimeout == 0 {
		o.WriteTimeout = DefaultWriteTimeout
	}
	if o.Clock == nil {
		o.Clock = systemClock{}
	}
	switch {
	case o.Skew < 0:
		return o, fmt.Errorf("usecase: skew %v is negative", o.Skew)
	case o.LockWait < 0 || o.RefreshTimeout < 0 || o.WriteTimeout < 0:
		return o, errors.New("usecase: timeouts must be positive")
	case o.RefreshTimeout >= o.LockWait:
		return o, fmt.Errorf("usecase: refresh timeout %v must be shorter than lock wait %v", o.RefreshTimeout, o.LockWait)
	}
	return o, nil
}

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
}

// NewRefreshTokenUseCase builds the use case.
func NewRefreshTokenUseCase(store TokenStore, refresher Refresher, opts Options) (*RefreshTokenUseCase, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	return &RefreshTokenUseCase{store: store, refresher: refresher, opts: opts}, nil
}

// Token returns a token for connectionID that is valid for at least the
// skew. Errors wrap domain.ErrNotFound, domain.ErrNeedsReauth,
// domain.ErrLockTimeout, domain.ErrProviderUnavailable,
// domain.ErrStoreUnavailable or the context's error.
//
// A cached fresh token costs no query and no lock. Otherwise one goroutine
// per connection and process reads the store (and refreshes if needed)
// while the others wait for it.
func (u *RefreshTokenUseCase) Token(ctx context.Context, connectionID string) (domain.Token, error) {
	t, state := u.cache.get(connectionID, u.opts.Clock.Now())
	if state == hit {
		return t, nil
	}
	t, err := u.flights.do(ctx, connectionID, u.flightLimit(), func(ctx context.Context) (domain.Token, error) {
		return u.load(ctx, connectionID, state == stale)
	})
	if err != nil {
		return domain.Token{}, fmt.Errorf("token for %s: %w", connectionID, err)
	}
	return t, nil
}

// Invalidate tells the use case that another process stored version of
// connectionID's token; any older cached copy is dropped.
func (u *RefreshTokenUseCase) Invalidate(connectionID string, version int64) {
	u.cache.invalidate(connectionID, version)
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
func (u *RefreshTokenUseCase) load(ctx context.Context, connectionID string, knownStale bool) (domain.Token, error) {
	epoch := u.cache.begin()
	if !knownStale {
		t, err := u.store.Get(ctx, connectionID)
		if err != nil {
			return domain.Token{}, err
		}
		if t.Status == domain.StatusNeedsReauth {
			return domain.Token{}, needsReauth(t)
		}
		if t.FreshAt(u.opts.Clock.Now(), u.opts.Skew) {
			u.cache.put(t, epoch, u.opts.Skew)
			return t, nil
		}
	}
	t, err := u.refresh(ctx, connectionID)
	if err != nil {
		return domain.Token{}, fmt.Errorf("refresh: %w", err)
	}
	u.cache.put(t, epoch, u.opts.Skew)
	return t, nil
}

// refresh takes the lock, re-reads, and redeems the refresh token only if
// nobody else has refreshed it meanwhile.
func (u *RefreshTokenUseCase) refresh(ctx context.Context, connectionID string) (domain.Token, error) {
	var (
		out     domain.Token
		revoked error // committed as needs_reauth, then returned
	)
	hold := u.opts.RefreshTimeout + u.opts.WriteTimeout
	err := u.store.InLock(ctx, connectionID, u.opts.LockWait, hold, func(txCtx context.Context, s LockedStore) error {
		t, err := s.Get(txCtx, connectionID)
		if err != nil {
			return err
		}
		if t.Status == domain.StatusNeedsReauth {
			return needsReauth(t)
		}
		if t.FreshAt(u.opts.Clock.Now(), u.opts.Skew) {
			out = t // another process refreshed while we waited
			return nil
		}
		// Last chance to give up: past this point the refresh token is
		// spent, and the new one must reach the database whatever the
		// caller does, so the rest runs under txCtx.
		if err := ctx.Err(); err != nil {
			return err
		}
		callCtx, cancel := context.WithTimeout(txCtx, u.opts.RefreshTimeout)
		g, err := u.refresher.Refresh(callCtx, t.RefreshToken)
		cancel()
		now := u.opts.Clock.Now()
		if err != nil {
			if !errors.Is(err, domain.ErrGrantRevoked) {
				return err // transient: roll back, stored token untouched
			}
			// Permanent: record it (keeping the refresh token for
			// forensics) so that no process redeems it again.
			t.Status = domain.StatusNeedsReauth
			t.StatusReason = reason(err)
			if _, saveErr := s.Save(txCtx, t); saveErr != nil {
				return errors.Join(err, saveErr)
			}
			revoked = fmt.Errorf("%w: %w", domain.ErrNeedsReauth, err)
			return nil
		}
		out, err = s.Save(txCtx, t.Rotated(g, now))
		return err
	})
	if err != nil {
		return domain.Token{}, err
	}
	if revoked != nil {
		return domain.Token{}, revoked
	}
	return out, nil
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
