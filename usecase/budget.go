package usecase

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// budgets remembers, per provider, until when the provider's token budget
// (shared fleet-wide, debited by TokenStore.Claim) was found spent, so
// that callers whose token is still valid are served it without asking
// the store again meanwhile.
type budgets struct {
	mu    sync.Mutex
	until map[string]time.Time
}

// spent records that provider's budget allows no request before until.
func (b *budgets) spent(provider string, until time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.until == nil {
		b.until = map[string]time.Time{}
	}
	if until.After(b.until[provider]) {
		b.until[provider] = until
	}
}

// wait is how long provider's budget is still known to be spent at now.
func (b *budgets) wait(provider string, now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return max(b.until[provider].Sub(now), 0)
}

// budgetSpent is the error of a refresh the provider's token budget
// refused for wait.
func budgetSpent(wait time.Duration) error {
	return fmt.Errorf("%w (for %v)", domain.ErrTokenBudgetSpent, wait.Round(time.Millisecond))
}

// awaitBudget waits, holding nothing, until provider's budget may allow a
// request (wait from now), another process announces the connection's
// token (woken), or the lock wait that began at asked is over.
func (u *RefreshTokenUseCase) awaitBudget(ctx context.Context, wait time.Duration, asked time.Time, woken <-chan struct{}) error {
	left := u.opts.LockWait - time.Since(asked)
	if left <= 0 {
		return fmt.Errorf("%w: %w", domain.ErrLockTimeout, budgetSpent(wait))
	}
	t := time.NewTimer(min(wait, left))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("%w (%w)", ctx.Err(), budgetSpent(wait))
	case <-woken:
	case <-t.C:
	}
	return nil
}

// shrinkOn429 spends provider's token budget, fleet-wide, for as long as
// the provider's 429 said to wait (Retry-After). The budget row is the
// store's; a store without budgets, or a provider without one, is left
// alone.
func (u *RefreshTokenUseCase) shrinkOn429(ctx context.Context, provider string, err error) {
	var pe *domain.ProviderError
	if !errors.As(err, &pe) || pe.HTTPStatus != http.StatusTooManyRequests || pe.RetryAfter <= 0 {
		return
	}
	s, ok := u.store.(BudgetShrinker)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, u.opts.WriteTimeout)
	defer cancel()
	budgeted, err := s.ShrinkBudget(ctx, provider, pe.RetryAfter)
	if err != nil {
		u.opts.Logger.Warn("could not shrink the provider's token budget after its 429", "provider", provider, "err", err)
	}
	if budgeted {
		u.budgets.spent(provider, u.opts.Clock.Now().Add(pe.RetryAfter))
	}
}
