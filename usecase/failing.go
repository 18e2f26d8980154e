package usecase

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// failingAfter: a connection whose refreshes get unclassified answers is asked again only after
// domain.FailingPause, fleet-wide, and after this many in a row is shown failing; the next success
// ends the episode. The grant is never touched.
const failingAfter = 3

// paced: err is a provider answer paced per connection, not retried: unclassified, or lost.
func paced(err error) (*domain.ProviderError, bool) {
	var pe *domain.ProviderError
	if !errors.As(err, &pe) {
		return nil, false
	}
	return pe, pe.Class == domain.Unclassified || pe.Lost
}

// checkFailure refuses a refresh of t its failure episode does not allow at now. The error wraps
// domain.ErrProviderUnavailable and domain.ErrRefreshFailing: a valid access token is served.
func checkFailure(t domain.Token, now time.Time) error {
	f := t.Failure
	switch {
	case f.Failures == 0:
		return nil
	case f.Blocked(now):
		return fmt.Errorf("%w: %w (%s): the refresh token may have been spent and the provider accepts none twice; connect again",
			domain.ErrProviderUnavailable, domain.ErrRefreshFailing, f.Describe())
	case now.Before(f.RetryAt):
		// The last answer rides along for its status and code, as Transient: not a new answer to pace.
		last := &domain.ProviderError{Code: f.Code, HTTPStatus: f.HTTPStatus, Class: domain.Transient}
		return fmt.Errorf("%w: %w (%s): next attempt in %v%w", domain.ErrProviderUnavailable, domain.ErrRefreshFailing,
			f.Describe(), f.RetryAt.Sub(now).Round(time.Millisecond), quiet{last})
	}
	return nil
}

// nextFailure is the episode prev becomes with the answer pe at now.
func nextFailure(prev domain.RefreshFailure, pe *domain.ProviderError, now time.Time) domain.RefreshFailure {
	f := domain.RefreshFailure{Failures: prev.Failures + 1, Since: prev.Since, LastAt: now,
		HTTPStatus: pe.HTTPStatus, Code: pe.Code, Failing: prev.Failing, ReplayUntil: prev.ReplayUntil}
	if f.Since.IsZero() {
		f.Since = now
	}
	f.RetryAt = now.Add(domain.FailingPause.Wait(f.Failures))
	// Evidence that the client works says the refusal is the grant's: shown failing at once.
	f.Failing = f.Failing || f.Failures >= failingAfter || pe.Evidence == domain.EvidenceClientWorks
	if pe.Lost {
		f.Code = cmp.Or(f.Code, domain.CodeAnswerLost)
		if f.ReplayUntil.IsZero() || (!pe.ReplayUntil.IsZero() && pe.ReplayUntil.Before(f.ReplayUntil)) {
			f.ReplayUntil = pe.ReplayUntil // the first presentation's window
		}
		switch {
		case pe.NoReplay || (!f.ReplayUntil.IsZero() && !f.RetryAt.Before(f.ReplayUntil)):
			// Never again: shown failing at once, for the user to connect again.
			f.RetryAt, f.Failing = time.Time{}, true
		case f.ReplayUntil.IsZero() && prev.Failures == 0:
			// Nothing known of the provider: again once it answers a probe, which may be asked at
			// once; a failed probe opens the pause.
			f.RetryAt = now
		case f.ReplayUntil.IsZero():
			f.Failing = true // the provider does not answer the probe
		}
	}
	return f
}

// recordFailure stores the failure episode pe opens or extends for the token c leased, and ends
// the lease (released if the write failed: the next caller then asks the provider again).
func (u *RefreshTokenUseCase) recordFailure(ctx context.Context, store TokenStore, c claimed, pe *domain.ProviderError) {
	t := c.Token
	f := nextFailure(t.Failure, pe, u.opts.Clock.Now())
	writeCtx, cancel := context.WithTimeout(ctx, u.opts.LockWait+u.opts.WriteTimeout)
	err := store.Fail(writeCtx, t, f)
	cancel()
	if errors.Is(err, domain.ErrConflict) {
		f, err = domain.RefreshFailure{}, nil // stored since: that version has no failure
	}
	c.End(err != nil)
	switch {
	case err != nil:
		u.opts.Logger.Error("refresh failure not recorded; the next caller asks the provider again",
			"connection", t.Connection, "err", err)
	case f.Failing && f.RetryAt.IsZero():
		u.opts.Logger.Error("connection failing: its refresh answer was lost and the provider accepts no refresh token twice; connect it again",
			"connection", t.Connection, "provider", t.Provider, "failure", f.Describe())
	case f.Failing:
		u.opts.Logger.Error("connection failing: the token endpoint's answers cannot be classified; asking it again later, the grant is untouched",
			"connection", t.Connection, "provider", t.Provider, "failure", f.Describe(), "next_attempt", f.RetryAt)
	}
}

// quiet wraps an error for errors.As without adding to the message.
type quiet struct{ err error }

func (quiet) Error() string   { return "" }
func (q quiet) Unwrap() error { return q.err }
