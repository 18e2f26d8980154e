package usecase

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// redeem resolves c's lease, waiting at most RefreshTimeout. A later answer is awaited in the
// background, under the lease, until the answer deadline; the caller is told errAnswerPending (a
// still-valid token is served through it) and the provider's calls pause (the hung gate).
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
	t := c.Token
	c.release() // the slot bounds calls that callers wait for, not a hung provider's queue
	err := fmt.Errorf("%w: %w: the token endpoint has not answered a refresh in %v; its answer is awaited for up to %v",
		domain.ErrProviderUnavailable, errAnswerPending, u.opts.RefreshTimeout, u.opts.AnswerDeadline)
	hung := &u.provider(t.Provider).hung
	hung.reject(u.opts.Clock.Now(), hung.generation.Load(), err)
	u.opts.Logger.Warn("token endpoint has not answered a refresh; awaiting its answer, callers get the current token while it is valid",
		"connection", t.Connection, "provider", t.Provider, "version", t.Version, "answer_deadline", u.opts.AnswerDeadline)
	go func() { // tells operators how the refresh that outlived its callers ended
		o := <-done
		log := u.opts.Logger.With("connection", t.Connection, "provider", t.Provider, "from_version", t.Version)
		switch err := u.redeemEnded(&RefreshEvent{Connection: t.Connection}, o.r, o.err, log); {
		case err == nil:
			log.Info("late answer to a refresh stored", "version", o.r.tok.Version)
		case err != o.r.revoked: // a dead grant's was told by redeemEnded
			log.Warn("refresh that outlived its callers failed", "err", err)
		}
	}()
	return redeemed{}, err
}

// errAnswerPending: the answer to a request that presented the stored refresh token is awaited.
var errAnswerPending = errors.New("the answer to the refresh under way is not in yet")

// overdue: another holder's lease has waited for its answer longer than a caller waits. Never when
// forced: the 401 says the provider already rotated, so the answer under way is worth waiting for.
func (u *RefreshTokenUseCase) overdue(l Lease, forced bool) bool {
	return !forced && l.Running && l.Age > u.opts.RefreshTimeout
}

// redeemEnded fills e with how redeeming r ended and returns the pass's error: for a dead grant
// r.revoked, told to OnNeedsReauth and to log unless nil (a sweep's event line says it).
func (u *RefreshTokenUseCase) redeemEnded(e *RefreshEvent, r redeemed, err error, log *slog.Logger) error {
	e.ProviderLatency, e.NewVersion = r.latency, r.tok.Version
	if err != nil || r.revoked == nil {
		return err
	}
	e.Outcome = OutcomeInvalidGrant
	if log != nil {
		log.Error("connection needs re-authorisation: the provider rejected its grant", "reason", r.reason)
	}
	u.opts.OnNeedsReauth(e.Connection, r.reason)
	return r.revoked
}

// abandoned records the lost answer of t's lease that ran out unresolved, so the refresh token is
// presented again only after a probe (domain.RefreshFailure.ProbeFirst). It returns t as stored.
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
	u.opts.Logger.Error("a refresh's holder vanished before its answer came; the refresh token is presented again once the provider answers a probe",
		"connection", t.Connection, "provider", t.Provider, "version", t.Version)
	t.Failure = f
	return t, nil
}

// probe presents a refresh token that cannot exist: any 2xx-4xx answer but 429 says the provider
// processes requests again, so a request of ours whose answer was lost was answered or dropped.
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
