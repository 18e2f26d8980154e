package usecase

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// A request that presented a refresh token is unresolved until its answer
// is in, or it is proven never to have reached the provider; while it is,
// no process presents that refresh token again (the lease, taken for the
// answer deadline, says so to every process). Callers do not wait that
// long: they stop after the refresh timeout. This file holds that wait:
// the detached answer, the overdue lease, the abandoned one, and the probe
// before a lost answer's refresh token is presented again.

// redeem spends the refresh token of the token c leased at the provider
// (resolve) and waits for the outcome at most RefreshTimeout. A provider
// that has not answered by then keeps its request: the answer is awaited
// in the background until the answer deadline, under the lease, so that no
// process presents the refresh token again meanwhile, while the caller is
// told errAnswerPending (a still-valid token is served through it) and the
// provider's calls pause (the hung gate): callers do not each wait out a
// hung provider.
func (u *RefreshTokenUseCase) redeem(ctx context.Context, store TokenStore, c claimed) (redeemed, error) {
	ctx = context.WithoutCancel(ctx)
	type outcome struct {
		r   redeemed
		err error
	}
	done := make(chan outcome, 1)
	u.flights.running.add() // a drain waits for the answer too
	go func() {
		defer u.flights.running.done()
		r, err := u.resolve(ctx, store, c)
		done <- outcome{r, err}
	}()
	timer := time.NewTimer(u.opts.RefreshTimeout)
	defer timer.Stop()
	select {
	case o := <-done:
		return o.r, o.err
	case <-timer.C:
	}
	t := c.current
	c.release() // the slot bounds calls that callers wait for, not a hung provider's queue
	err := fmt.Errorf("%w: %w: the token endpoint has not answered a refresh in %v; its answer is awaited for up to %v",
		domain.ErrProviderUnavailable, errAnswerPending, u.opts.RefreshTimeout, u.opts.AnswerDeadline)
	hung := u.hung.of(t.Provider)
	hung.reject(u.opts.Clock.Now(), hung.settings(), err)
	u.opts.Logger.Warn("token endpoint has not answered a refresh; awaiting its answer, callers get the current token while it is valid",
		"connection", t.Connection, "provider", t.Provider, "version", t.Version, "answer_deadline", u.opts.AnswerDeadline)
	go func() {
		o := <-done
		u.late(t, o.r, o.err)
	}()
	return redeemed{from: t.RefreshToken}, err
}

// errAnswerPending: a request that presented the stored refresh token is
// unresolved (its answer is awaited), so the token cannot be refreshed
// now. It comes wrapped with domain.ErrProviderUnavailable and
// domain.ErrRefreshInProgress.
var errAnswerPending = errors.New("the answer to the refresh under way is not in yet")

// answerPending is the error of a caller that found another holder's
// lease running past RefreshTimeout: it does not wait for the answer.
func (u *RefreshTokenUseCase) answerPending(l Lease) error {
	return fmt.Errorf("%w: %w: %w (presented %v ago)", domain.ErrProviderUnavailable, domain.ErrRefreshInProgress,
		errAnswerPending, l.Age.Round(time.Millisecond))
}

// overdue reports whether another holder's running lease has waited for
// its answer longer than a caller waits. Never for a forced refresh: the
// 401 that forced it says the provider has already rotated, so the answer
// under way is the newer token, worth waiting for within the lock wait.
func (u *RefreshTokenUseCase) overdue(l Lease, forced bool) bool {
	return !forced && l.Running && l.Age > u.opts.RefreshTimeout
}

// late tells operators how a refresh that outlived its callers ended.
func (u *RefreshTokenUseCase) late(t domain.Token, r redeemed, err error) {
	log := u.opts.Logger.With("connection", t.Connection, "provider", t.Provider, "from_version", t.Version)
	switch {
	case err == nil && r.revoked != nil:
		log.Error("connection needs re-authorisation: the provider rejected its grant", "reason", r.reason)
		u.opts.OnNeedsReauth(t.Connection, r.reason)
	case err == nil:
		log.Info("late answer to a refresh stored", "version", r.tok.Version)
	default:
		log.Warn("refresh that outlived its callers failed", "err", err)
	}
}

// abandoned records, for t's version, the lost answer of a lease that ran
// out unresolved (its holder vanished with its request unanswered), so
// that the refresh token is presented again only after a probe of the
// provider (domain.RefreshFailure.ProbeFirst). It returns the token as
// stored afterwards.
func (u *RefreshTokenUseCase) abandoned(ctx context.Context, t domain.Token) (domain.Token, error) {
	ctx, cancel := context.WithTimeout(ctx, u.opts.LockWait+u.opts.WriteTimeout)
	defer cancel()
	f := nextFailure(t.Failure, &domain.ProviderError{Lost: true}, u.opts.Clock.Now())
	err := u.store.Fail(ctx, t, f)
	if errors.Is(err, domain.ErrConflict) {
		cur, _, err := u.store.Read(ctx, t.Connection) // stored since: nothing was lost
		return cur, err
	}
	if err != nil {
		return t, fmt.Errorf("record the lost answer of an abandoned refresh: %w", err)
	}
	out := t
	out.Failure = f
	u.opts.Logger.Error("a refresh's holder vanished before its answer came; the refresh token is presented again once the provider answers a probe",
		"connection", t.Connection, "provider", t.Provider, "version", t.Version)
	return out, nil
}

// answered reports whether the provider answered a call that ended with
// err: it is not hanging.
func answered(err error) bool {
	var pe *domain.ProviderError
	return err == nil || (errors.As(err, &pe) && pe.HTTPStatus != 0)
}

// probe asks provider's token endpoint to redeem a refresh token that
// cannot exist, before a refresh token whose last answer was lost is
// presented again: an answer (any 2xx, 3xx or 4xx but 429) says the
// provider processes requests again, so a request of ours queued there
// has been answered or dropped.
func (u *RefreshTokenUseCase) probe(ctx context.Context, provider string) error {
	ctx, cancel := context.WithTimeout(ctx, u.opts.RefreshTimeout)
	defer cancel()
	_, err := u.refresher.Refresh(ctx, provider, domain.NewSecret("tokenguard-probe-"+rand.Text()))
	var pe *domain.ProviderError
	if err == nil || (errors.As(err, &pe) && pe.HTTPStatus != 0 && pe.HTTPStatus < 500 && pe.HTTPStatus != 429) {
		return nil
	}
	return fmt.Errorf("%w: the token endpoint does not answer a probe, and the last answer to this refresh token was lost: %w",
		domain.ErrProviderUnavailable, err)
}
