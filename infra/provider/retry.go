package provider

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/provider/profiles"
)

// GrantRefresher redeems a refresh token (Refresher, Retrying).
type GrantRefresher interface {
	Refresh(ctx context.Context, refreshToken domain.Secret) (domain.Grant, error)
}

// Policy tunes Retrying. Zero values take the defaults.
type Policy struct {
	InitialInterval time.Duration // default 100ms, doubling
	MaxInterval     time.Duration // caps every backoff, jitter included (default 2s)
	Jitter          float64       // each wait from interval×[1-Jitter, 1+Jitter] (default 0.5; negative: none)
	MaxAttempts     int           // the first included; 0: only the deadline bounds them
	// RetryWithin bounds when a new attempt may start, from the first (0: until
	// the deadline); an attempt under way may run to ctx's deadline.
	RetryWithin time.Duration
	// AnswerWithin: a retry starts only while this much of ctx's time is left, so that
	// its answer is awaited that long (0: any time before the deadline).
	AnswerWithin time.Duration
	// PauseAfter: tries in a row finding the endpoint unreachable before calls
	// fail at once for a pause (default DefaultPauseAfter; negative: never).
	PauseAfter int
	Log        *slog.Logger // one line per retry, never a token; nil: none
	// ReuseGrace decides whether a request whose answer was lost is sent again (a strict
	// provider revokes a grant whose spent token comes back): Unknown, not within the call;
	// None, never (NoReplay); a window, only within it from the first presentation (ReplayUntil).
	ReuseGrace     profiles.Duration
	ReplayHarmless bool // refresh tokens do not rotate: a lost answer's token may go again at once
}

// PolicyFor is the retry policy of a provider with profile p.
func PolicyFor(p profiles.Profile, log *slog.Logger) Policy {
	return Policy{Log: log, ReplayHarmless: p.Rotation == profiles.RotationNo, ReuseGrace: p.Grace}
}

func (p Policy) withDefaults() Policy {
	p.InitialInterval = cmp.Or(max(p.InitialInterval, 0), 100*time.Millisecond)
	p.MaxInterval = max(cmp.Or(max(p.MaxInterval, 0), 2*time.Second), p.InitialInterval)
	p.Jitter = min(max(cmp.Or(p.Jitter, 0.5), 0), 1)
	p.PauseAfter = cmp.Or(p.PauseAfter, DefaultPauseAfter)
	p.Log = cmp.Or(p.Log, slog.New(slog.DiscardHandler))
	return p
}

// maxElapsed bounds a call whose ctx has no deadline.
const maxElapsed = 30 * time.Second

// Retrying retries transient failures (ErrProviderUnavailable) with capped,
// jittered exponential backoff; safe for concurrent use. Every wait ends before
// ctx's deadline, so retries never outlast the connection's lock (backoff.Retry
// would sleep past it); a lost answer's request goes again only as ReuseGrace allows.
type Retrying struct {
	next   GrantRefresher
	policy Policy
	pause  domain.Pause // any answer ends it
}

// NewRetrying decorates next with policy.
func NewRetrying(next GrantRefresher, policy Policy) *Retrying {
	r := &Retrying{next: next, policy: policy.withDefaults(), pause: domain.Pause{Policy: domain.UnreachablePause}}
	r.pause.Policy.After = r.policy.PauseAfter
	return r
}

// Refresh retries until success, a permanent failure or the time is up, and
// returns the last error (joined with ctx's when ctx ended the retries).
func (r *Retrying) Refresh(ctx context.Context, refreshToken domain.Secret) (domain.Grant, error) {
	p := r.policy
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, maxElapsed)
		defer cancel()
	}
	deadline, _ := ctx.Deadline()
	b := &backoff.ExponentialBackOff{
		InitialInterval:     p.InitialInterval,
		RandomizationFactor: p.Jitter,
		Multiplier:          2,
		MaxInterval:         p.MaxInterval,
	}
	b.Reset()

	var last error
	first := time.Now() // the refresh token's first presentation, for ReuseGrace
	for attempt := 1; ; attempt++ {
		if err := r.paused(time.Now()); err != nil {
			if last != nil {
				return domain.Grant{}, attempts(attempt-1, last)
			}
			return domain.Grant{}, err
		}
		g, err := r.next.Refresh(ctx, refreshToken)
		if r.record(time.Now(), err) {
			p.Log.LogAttrs(ctx, slog.LevelWarn, "token endpoint unreachable: calls to it fail at once for a while",
				slog.String("error", err.Error()))
		}
		if err == nil {
			return g, nil
		}
		last = err
		var pe *domain.ProviderError
		if !errors.Is(err, domain.ErrProviderUnavailable) || errors.Is(err, domain.ErrGrantRevoked) || r.paused(time.Now()) != nil ||
			(errors.As(err, &pe) && (pe.Class == domain.Unclassified || !r.mayReplay(pe, first))) {
			return domain.Grant{}, attempts(attempt, err)
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			return domain.Grant{}, attempts(attempt, joinCtx(err, ctxErr))
		}
		wait := min(b.NextBackOff(), p.MaxInterval)
		if pe != nil && pe.RetryAfter > wait {
			wait = pe.RetryAfter
		}
		// Out of attempts, or the next try could not start in time.
		if (p.MaxAttempts > 0 && attempt >= p.MaxAttempts) || time.Until(deadline) <= wait+p.AnswerWithin ||
			(p.RetryWithin > 0 && time.Since(first)+wait >= p.RetryWithin) {
			return domain.Grant{}, attempts(attempt, err)
		}
		p.Log.LogAttrs(ctx, slog.LevelWarn, "token refresh failed, retrying",
			slog.Int("attempt", attempt), slog.Duration("wait", wait), slog.String("error", err.Error()))
		select {
		case <-time.After(wait): // collected unfired since Go 1.23
		case <-ctx.Done():
			return domain.Grant{}, attempts(attempt, joinCtx(err, ctx.Err()))
		}
	}
}

// mayReplay reports whether the request that got pe may be sent again and, for a
// lost answer, notes on pe what the provider allows.
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

// DefaultPauseAfter is how many tries in a row may find the token endpoint
// unreachable before its calls pause (domain.UnreachablePause).
const DefaultPauseAfter = 3

// paused returns the failure that pauses the calls at now, or nil.
func (r *Retrying) paused(now time.Time) error {
	left, cause := r.pause.Check(now)
	if cause == nil {
		return nil
	}
	return &domain.ProviderError{Err: fmt.Errorf("token endpoint not called for %v after it was unreachable: %w",
		left.Round(time.Millisecond), cause)}
}

// record takes a try's outcome and reports whether it started a pause.
func (r *Retrying) record(now time.Time, err error) (started bool) {
	switch {
	case r.policy.PauseAfter < 0 || errors.Is(err, context.Canceled): // the caller gave up: says nothing about the endpoint
		return false
	case !unreachable(err):
		r.pause.Succeed()
		return false
	}
	return r.pause.Fail(now, err)
}

// unreachable: no request reached the HTTP server (refused, no route, DNS,
// TLS), so none spent the refresh token.
func unreachable(err error) bool {
	var pe *domain.ProviderError
	if !errors.As(err, &pe) || pe.HTTPStatus != 0 || pe.Err == nil {
		return false
	}
	errnos := []error{syscall.ECONNREFUSED, syscall.EHOSTUNREACH, syscall.ENETUNREACH}
	types := []any{new(*net.DNSError), new(*tls.CertificateVerificationError), new(tls.RecordHeaderError),
		new(tls.AlertError), new(x509.UnknownAuthorityError), new(x509.HostnameError), new(x509.CertificateInvalidError)}
	return slices.ContainsFunc(errnos, func(e error) bool { return errors.Is(pe.Err, e) }) ||
		slices.ContainsFunc(types, func(t any) bool { return errors.As(pe.Err, t) })
}
