package provider

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/provider/profiles"
)

// GrantRefresher redeems a refresh token and reports failures as the
// domain does (Refresher, Retrying).
type GrantRefresher interface {
	Refresh(ctx context.Context, refreshToken domain.Secret) (domain.Grant, error)
}

// Policy tunes Retrying. Zero values take the defaults.
type Policy struct {
	// InitialInterval is the first backoff (default 100ms).
	InitialInterval time.Duration
	// MaxInterval caps every backoff, jitter included (default 2s).
	MaxInterval time.Duration
	// Multiplier grows the backoff after each failure (default 2).
	Multiplier float64
	// Jitter is the randomisation factor: each wait is drawn from
	// interval×[1-Jitter, 1+Jitter] (default 0.5; negative means none).
	Jitter float64
	// MaxAttempts bounds the tries, the first included; 0 means only the
	// deadline bounds them.
	MaxAttempts int
	// MaxElapsed bounds the whole call when ctx has no deadline
	// (default 30s). With a deadline, the deadline alone bounds it.
	MaxElapsed time.Duration
	// RetryWithin bounds when a new attempt may start, from the first
	// (0: until the deadline); an attempt under way may still run to ctx's
	// deadline (the refresh timeout, against the answer deadline).
	RetryWithin time.Duration
	// AttemptTimeout bounds one try (0: all the time left). A try cut short
	// counts as a timeout; see Retrying about cutting off a slow success.
	AttemptTimeout time.Duration
	// PauseAfter is how many tries in a row may find the token endpoint
	// unreachable (refused, DNS, TLS) before every call fails at once for a
	// pause (default DefaultPauseAfter; negative: never pause).
	PauseAfter int
	// Log receives one line per retry (never a token); nil logs nothing.
	Log *slog.Logger
	// ReuseGrace is the provider's declared reuse grace window: whether a
	// request whose answer was lost (the refresh token may be spent) is sent
	// again. Unknown (the zero value): not within the call; the use case
	// presents it again once the provider answers again. None: never
	// (domain.ProviderError.NoReplay). A window: only within it from the
	// first presentation (ReplayUntil). PolicyFor sets it from a profile.
	ReuseGrace profiles.Duration
	// ReplayHarmless: the provider does not rotate refresh tokens, so a
	// lost answer's token may be presented again at once.
	ReplayHarmless bool
}

// PolicyFor is the retry policy of a provider with profile p: its reuse
// grace window, unless its refresh tokens do not rotate.
func PolicyFor(p profiles.Profile, log *slog.Logger) Policy {
	pol := Policy{Log: log, ReplayHarmless: p.Rotation == profiles.RotationNo}
	if !pol.ReplayHarmless {
		pol.ReuseGrace = p.Grace
	}
	return pol
}

func (p Policy) withDefaults() Policy {
	if p.InitialInterval <= 0 {
		p.InitialInterval = 100 * time.Millisecond
	}
	if p.MaxInterval <= 0 {
		p.MaxInterval = 2 * time.Second
	}
	p.MaxInterval = max(p.MaxInterval, p.InitialInterval)
	if p.Multiplier < 1 {
		p.Multiplier = 2
	}
	switch {
	case p.Jitter == 0:
		p.Jitter = 0.5
	case p.Jitter < 0:
		p.Jitter = 0
	case p.Jitter > 1:
		p.Jitter = 1
	}
	if p.MaxElapsed <= 0 {
		p.MaxElapsed = 30 * time.Second
	}
	if p.PauseAfter == 0 {
		p.PauseAfter = DefaultPauseAfter
	}
	return p
}

// Retrying retries a GrantRefresher's transient failures (errors wrapping
// domain.ErrProviderUnavailable) with capped exponential backoff and jitter
// (github.com/cenkalti/backoff/v5). Any other failure is returned after the
// first try: asking again cannot change the answer, and the use case
// decides. It is safe for concurrent use.
//
// A token endpoint found unreachable Policy.PauseAfter times in a row is
// paused: until the pause ends, every call fails at once, so callers whose
// token is still valid get it and the others learn it at once.
//
// Every wait ends before ctx's deadline: a Retry-After is the minimum wait,
// and when a wait would reach past the deadline it gives up at once with
// the last error. The use case calls it inside the connection's lock with
// the refresh timeout, shorter than the lock wait, so retries never outlast
// the lock bound. Retrying only presents the same token again; the caller
// persists a token only after a success.
//
// A retry after a lost answer (domain.ProviderError.Lost) may present a
// token the provider already rotated, or one still queued there, which a
// strict provider takes for a reuse and revokes the grant: Policy.ReuseGrace
// decides. For the same reason AttemptTimeout should not be set below the
// provider's worst normal latency.
//
// backoff.Retry is not used: it treats Retry-After as an exact wait, sleeps
// up to the deadline even when the next try could not fit, and on
// cancellation returns the context's error instead of the provider's.
type Retrying struct {
	next   GrantRefresher
	policy Policy
	pause  *pause
}

// NewRetrying decorates next with policy (zero fields take the defaults).
func NewRetrying(next GrantRefresher, policy Policy) *Retrying {
	policy = policy.withDefaults()
	return &Retrying{next: next, policy: policy, pause: newPause(policy.PauseAfter)}
}

// Refresh calls the decorated refresher until it succeeds, fails
// permanently, or the time is up. On failure it returns the last error,
// which keeps its kind (errors.Is ErrProviderUnavailable or ErrGrantRevoked,
// errors.As *domain.ProviderError), joined with ctx's error when ctx ended
// the retries.
func (r *Retrying) Refresh(ctx context.Context, refreshToken domain.Secret) (domain.Grant, error) {
	p := r.policy
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.MaxElapsed)
		defer cancel()
	}
	deadline, _ := ctx.Deadline()
	b := &backoff.ExponentialBackOff{
		InitialInterval:     p.InitialInterval,
		RandomizationFactor: p.Jitter,
		Multiplier:          p.Multiplier,
		MaxInterval:         p.MaxInterval,
	}
	b.Reset()

	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	var last error
	first := time.Now() // the refresh token's first presentation, for ReuseGrace
	for attempt := 1; ; attempt++ {
		if err := r.pause.check(time.Now()); err != nil {
			if last != nil {
				return domain.Grant{}, attempts(attempt-1, last)
			}
			return domain.Grant{}, err
		}
		g, err := r.try(ctx, refreshToken)
		if r.pause.record(time.Now(), err) && p.Log != nil {
			p.Log.LogAttrs(ctx, slog.LevelWarn, "token endpoint unreachable: calls to it fail at once for a while",
				slog.String("error", err.Error()))
		}
		if err == nil {
			return g, nil
		}
		last = err
		if !errors.Is(err, domain.ErrProviderUnavailable) || errors.Is(err, domain.ErrGrantRevoked) || r.pause.check(time.Now()) != nil {
			return domain.Grant{}, attempts(attempt, err)
		}
		var pe *domain.ProviderError
		if errors.As(err, &pe) && (pe.Class == domain.Unclassified || !r.mayReplay(pe, first)) {
			// The use case paces unclassified answers per connection.
			return domain.Grant{}, attempts(attempt, err)
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			return domain.Grant{}, attempts(attempt, joinCtx(err, ctxErr))
		}
		if p.MaxAttempts > 0 && attempt >= p.MaxAttempts {
			return domain.Grant{}, attempts(attempt, err)
		}
		wait := min(b.NextBackOff(), p.MaxInterval)
		if pe != nil && pe.RetryAfter > wait {
			wait = pe.RetryAfter
		}
		if time.Until(deadline) <= wait || (p.RetryWithin > 0 && time.Since(first)+wait >= p.RetryWithin) {
			// The next try could not start in time.
			return domain.Grant{}, attempts(attempt, err)
		}
		if p.Log != nil {
			p.Log.LogAttrs(ctx, slog.LevelWarn, "token refresh failed, retrying",
				slog.Int("attempt", attempt), slog.Duration("wait", wait), slog.String("error", err.Error()))
		}
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		select {
		case <-timer.C:
		case <-ctx.Done():
			return domain.Grant{}, attempts(attempt, joinCtx(err, ctx.Err()))
		}
	}
}

// mayReplay reports whether the request that got pe may be sent again as
// far as ReuseGrace goes, and for a lost answer notes on pe what the
// provider allows.
func (r *Retrying) mayReplay(pe *domain.ProviderError, first time.Time) bool {
	g := r.policy.ReuseGrace
	switch {
	case !pe.Lost || r.policy.ReplayHarmless:
		return true
	case !g.Known:
		return false // the use case probes the endpoint first
	}
	if g.D <= 0 {
		pe.NoReplay = true
		return false
	}
	pe.ReplayUntil = first.Add(g.D)
	return time.Now().Before(pe.ReplayUntil)
}

func (r *Retrying) try(ctx context.Context, refreshToken domain.Secret) (domain.Grant, error) {
	if r.policy.AttemptTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.policy.AttemptTimeout)
		defer cancel()
	}
	return r.next.Refresh(ctx, refreshToken)
}

func attempts(n int, err error) error {
	if n == 1 {
		return err
	}
	return fmt.Errorf("after %d attempts: %w", n, err)
}

func joinCtx(err, ctxErr error) error {
	if errors.Is(err, ctxErr) {
		return err
	}
	return fmt.Errorf("%w (%w)", err, ctxErr)
}
