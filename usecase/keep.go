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

// resolve spends the leased refresh token, holding no database connection, and keeps the outcome:
// the rotated token, or needs_reauth for a dead grant (r.revoked, with a nil error); a failure that
// leaves the grant alive ends the lease and is returned. It runs to the end whatever the caller
// does: the refresh token is spent once sent.
func (u *RefreshTokenUseCase) resolve(ctx context.Context, store TokenStore, c claimed) (redeemed, error) {
	t := c.Token
	var r redeemed
	if t.Failure.ProbeFirst() {
		if err := u.probe(ctx, t.Provider); err != nil {
			c.release()
			c.note("answer lost: the provider does not answer the probe asked before the refresh token is presented again")
			u.recordFailure(ctx, store, c, &domain.ProviderError{Lost: true, Err: err})
			return r, err
		}
	}
	callCtx, cancel := context.WithTimeout(ctx, u.opts.callWindow())
	callCtx, span := u.opts.Tracer.Start(callCtx, StepProvider, t.Connection)
	p := u.provider(t.Provider)
	settings := p.gate.generation.Load() // the provider's settings the call goes out with
	called := time.Now()
	g, err := u.present(callCtx, t)
	r.latency = time.Since(called)
	f := Facts{Provider: t.Provider, OldVersion: t.Version, Outcome: outcome(err)}
	if errors.Is(err, domain.ErrGrantRevoked) {
		f.Outcome = OutcomeInvalidGrant
	}
	span.End(f, err)
	cancel()
	u.shrinkOn429(ctx, t.Provider, err)
	// The slot bounds the calls at the provider: the next may start while this answer is written.
	c.release()
	var answer *domain.ProviderError
	if err == nil || (errors.As(err, &answer) && answer.HTTPStatus != 0) {
		p.hung.pause.Succeed() // the provider answered
	}
	if err != nil && !errors.Is(err, domain.ErrGrantRevoked) {
		c.note(u.why(err))
	}
	switch pe, isPaced := paced(err); {
	case err == nil:
		p.gate.pause.Succeed()
		r.tok, err = u.keep(ctx, store, t.Rotated(g, u.opts.Clock.Now()), t.RefreshToken, c.End)
	case clientSide(err):
		c.End(true)
		u.clientFailed(t, settings, err)
	case isPaced:
		u.recordFailure(ctx, store, c, pe)
		if pe.Class == domain.Unclassified && !pe.Lost {
			// Callers are told the refresh is failing, with the answer.
			err = fmt.Errorf("%w: %w", domain.ErrRefreshFailing, err)
		}
	case errors.Is(err, domain.ErrGrantRevoked):
		defer c.End(false)
		return u.dead(ctx, store, t, r, err)
	default:
		c.End(true)
	}
	return r, err
}

// dead stores t's connection as needs_reauth after the provider rejected its grant, unless a newer
// token was stored meanwhile (stale news: r.tok is that token). The refresh token is kept, for forensics.
func (u *RefreshTokenUseCase) dead(ctx context.Context, store TokenStore, t domain.Token, r redeemed, rejected error) (redeemed, error) {
	ctx, span := u.opts.Tracer.Start(ctx, StepCommit, t.Connection)
	marked := t
	marked.Status, marked.StatusReason = domain.StatusNeedsReauth, u.reasonFor(t, rejected)
	writeCtx, cancel := context.WithTimeout(ctx, u.opts.LockWait+u.opts.WriteTimeout)
	stored, err := store.Store(writeCtx, marked)
	if errors.Is(err, domain.ErrConflict) {
		if stored, _, err = store.Read(writeCtx, t.Connection); err == nil && stored.Status == domain.StatusActive {
			r.tok = stored // stale news
		}
	}
	cancel()
	facts := Facts{Provider: t.Provider, OldVersion: t.Version, NewVersion: stored.Version, Outcome: OutcomeInvalidGrant}
	if r.tok.Version != 0 {
		facts.Outcome = OutcomeSkippedFresh
	}
	span.End(facts, err)
	switch {
	case err != nil:
		return r, errors.Join(rejected, err)
	case r.tok.Version == 0:
		r.reason = cmp.Or(stored.StatusReason, marked.StatusReason)
		r.revoked = fmt.Errorf("%w: %w", domain.ErrNeedsReauth, rejected)
	}
	return r, nil
}

// keep stores a rotated token if the stored token is still the one it was rotated from, ending its
// lease; a failed write is retried for RescueWindow (the rescue) unless another token was stored
// meanwhile. Exception: if this lease ran out at the provider, another process may have presented
// the same refresh token, been told invalid_grant and marked the connection needs_reauth; while the
// stored refresh token is the spent one, the rotated token is the grant's only live one: stored.
func (u *RefreshTokenUseCase) keep(ctx context.Context, store TokenStore, rotated domain.Token, from domain.Secret,
	end func(release bool)) (domain.Token, error) {
	defer end(false)
	log := u.opts.Logger.With("connection", rotated.Connection, "from_version", rotated.Version)
	attempt := func() (domain.Token, error) {
		writeCtx, cancel := context.WithTimeout(ctx, u.opts.LockWait+u.opts.WriteTimeout)
		defer cancel()
		out, err := store.Store(writeCtx, rotated)
		if !errors.Is(err, domain.ErrConflict) {
			return out, err
		}
		now, _, err := store.Read(writeCtx, rotated.Connection)
		switch {
		case err != nil:
			return domain.Token{}, err
		case now.Version > rotated.Version && now.RefreshToken.Equal(rotated.RefreshToken):
			return now, nil // an earlier write had in fact gone through (its answer was lost)
		case now.Status == domain.StatusNeedsReauth && now.RefreshToken.Equal(from):
			log.Error("connection was marked needs_reauth by a process that presented the refresh token this one had already rotated; storing the rotated token instead",
				"stored_version", now.Version, "reason", now.StatusReason)
			next := rotated
			next.Version = now.Version
			return store.Store(writeCtx, next)
		}
		return domain.Token{}, backoff.Permanent(fmt.Errorf("%w: stored version is %d", domain.ErrConflict, now.Version))
	}
	done := func(span Span, out domain.Token, err error) {
		f := Facts{Provider: rotated.Provider, OldVersion: rotated.Version}
		if err == nil {
			f.NewVersion, f.Outcome = out.Version, OutcomeOK
		}
		span.End(f, err)
	}
	_, span := u.opts.Tracer.Start(ctx, StepCommit, rotated.Connection)
	out, cause := attempt()
	done(span, out, cause)
	if cause == nil {
		return out, nil
	}
	log.Error("rotated refresh token not persisted; retrying the write", "err", cause)
	var permanent *backoff.PermanentError
	if !errors.As(cause, &permanent) {
		ctx, rescue := u.opts.Tracer.Start(ctx, StepRescue, rotated.Connection)
		ctx, cancel := context.WithTimeout(ctx, u.opts.RescueWindow)
		defer cancel()
		policy := backoff.NewExponentialBackOff()
		policy.InitialInterval, policy.MaxInterval = 50*time.Millisecond, time.Second
		out, cause = backoff.Retry(ctx, func() (domain.Token, error) {
			out, err := attempt()
			if err != nil {
				log.Error("rotated refresh token still not persisted", "err", err)
			}
			return out, err
		}, backoff.WithBackOff(policy), backoff.WithMaxElapsedTime(u.opts.RescueWindow))
		done(rescue, out, cause)
		if cause == nil {
			log.Warn("rotated refresh token persisted on retry", "version", out.Version)
			return out, nil
		}
	}
	log.Error("rotated refresh token dropped", "err", cause)
	return domain.Token{}, fmt.Errorf("persist rotated token: %w", cause)
}

// why names, for the connection's history, the end of a refresh that stored no token because of
// err: the provider's status and code, never a body, a URL or a secret.
func (u *RefreshTokenUseCase) why(err error) string {
	var pe *domain.ProviderError
	if !errors.As(err, &pe) {
		return "not stored: the request could not be made"
	}
	answer := "no answer"
	if pe.HTTPStatus != 0 {
		answer = fmt.Sprintf("HTTP %d %s", pe.HTTPStatus, cmp.Or(pe.Code, "no code"))
	}
	var timeout interface{ Timeout() bool }
	timedOut := errors.Is(pe.Err, context.DeadlineExceeded) || (errors.As(pe.Err, &timeout) && timeout.Timeout())
	switch {
	case pe.Lost && timedOut:
		return fmt.Sprintf("timeout: no answer within %v; the answer is lost", u.opts.AnswerDeadline)
	case pe.Lost:
		return "answer lost: the connection dropped after the request was sent (" + answer + ")"
	case pe.Class == domain.Unclassified:
		return "unclassified answer: " + answer
	case pe.Class == domain.ClientRejected:
		return "not stored: the token endpoint rejected the client (" + answer + ")"
	case pe.Class == domain.EndpointMisconfigured:
		return "not stored: the token URL does not answer as a token endpoint (" + answer + ")"
	case timedOut:
		return "not stored: timeout before the request was sent; provider unavailable"
	}
	return "not stored: provider unavailable (" + answer + ")"
}

// ProofKeys reads the DPoP key (RFC 9449) a connection's grant is bound to; the token store is one.
type ProofKeys interface {
	// DPoPKey is connection's private key (PEM) whose thumbprint is jkt.
	DPoPKey(ctx context.Context, connection, jkt string) (domain.Secret, error)
}

// BoundRefresher redeems refresh tokens bound to a DPoP key: each request carries a proof signed with key.
type BoundRefresher interface {
	RefreshBound(ctx context.Context, provider string, refreshToken, key domain.Secret) (domain.Grant, error)
}

// present presents t's refresh token, with a proof of its key when the grant is sender-constrained.
func (u *RefreshTokenUseCase) present(ctx context.Context, t domain.Token) (domain.Grant, error) {
	if !t.SenderConstrained() {
		return u.refresher.Refresh(ctx, t.Provider, t.RefreshToken)
	}
	keys, ok := u.store.(ProofKeys)
	bound, ok2 := u.refresher.(BoundRefresher)
	if !ok || !ok2 {
		return domain.Grant{}, &domain.ProviderError{Class: domain.EndpointMisconfigured,
			Err: errors.New("the grant is bound to a DPoP key and the refresher cannot sign proofs")}
	}
	key, err := keys.DPoPKey(ctx, t.Connection, t.DPoPJKT)
	if err != nil {
		return domain.Grant{}, fmt.Errorf("refresh %s: %w", t.Connection, err)
	}
	return bound.RefreshBound(ctx, t.Provider, t.RefreshToken, key)
}
