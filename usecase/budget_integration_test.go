package usecase_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/internal/testworld"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// A 429 with Retry-After shrinks the provider's budget, fleet-wide, for
// the Retry-After: the budget row records it, a second later than the
// requests the sandbox refused. The still-valid tokens are served
// meanwhile. Without a budget (the control) the 429 leaves no row.
func TestTokenBudget429ShrinksIt(t *testing.T) {
	for _, budgeted := range []bool{true, false} {
		w := testworld.New(t, time.Hour)
		s := w.Stack(t, usecase.Options{})
		names := w.ConnectMany(t, s, 6)
		if err := s.DB.Exec(`UPDATE tokenguard_tokens SET expiry = now() + interval '1 minute', obtained_at = now() - interval '1 hour'`).Error; err != nil {
			t.Fatal(err)
		}
		repo := repository.NewTokenRepository(s.DB, tokencrypt.Plaintext{})
		if budgeted {
			repo.SetTokenRate(domain.TokenRate{Limit: 20, Period: time.Second})
		}
		uc, err := usecase.NewRefreshTokenUseCase(repo, provider.Only(provider.NewRefresher(w.OAuth, provider.NewHTTPClient(5*time.Second))),
			usecase.Options{Skew: 2 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		w.Provider.SetTokenRate(2) // below the budget: the sandbox refuses what the budget allows
		var wg sync.WaitGroup
		for _, name := range names {
			wg.Go(func() {
				if _, err := uc.Token(context.Background(), name); err != nil {
					t.Errorf("budgeted %v: %s: %v (its token is still valid)", budgeted, name, err)
				}
			})
		}
		wg.Wait()
		if n := w.Provider.Stats().RateLimited; n == 0 {
			t.Fatalf("budgeted %v: the sandbox refused nothing", budgeted)
		}
		var rows []struct {
			ShrunkBy *float64 // seconds from the last request debited to shrunk_until
		}
		if err := s.DB.Raw(`SELECT extract(epoch FROM shrunk_until - spent[cardinality(spent)])::float8 AS shrunk_by FROM tokenguard_token_budgets`).
			Find(&rows).Error; err != nil {
			t.Fatal(err)
		}
		switch {
		case !budgeted && len(rows) != 0:
			t.Errorf("control: a budget row without a budget: %+v", rows)
		case budgeted && (len(rows) != 1 || rows[0].ShrunkBy == nil || *rows[0].ShrunkBy < 0.9 || *rows[0].ShrunkBy > 3):
			t.Errorf("budgeted: the 429's Retry-After: 1 did not shrink the budget for about a second after the requests: %+v", rows)
		}
		w.Provider.SetTokenRate(0)
	}
}

// The proactive sweep spends only what callers leave: of a budget of 4 a
// minute it takes 3 and skips the rest; the fourth is a caller's.
func TestTokenBudgetSweepLeavesCallersTheirReserve(t *testing.T) {
	w := testworld.New(t, time.Hour)
	s := w.Stack(t, usecase.Options{})
	names := w.ConnectMany(t, s, 6)
	if err := s.DB.Exec(`UPDATE tokenguard_tokens SET expiry = now() + interval '1 minute', obtained_at = now() - interval '1 hour'`).Error; err != nil {
		t.Fatal(err)
	}
	repo := repository.NewTokenRepository(s.DB, tokencrypt.Plaintext{})
	repo.SetTokenRate(domain.TokenRate{Limit: 4, Period: time.Minute})
	uc, err := usecase.NewRefreshTokenUseCase(repo, provider.Only(provider.NewRefresher(w.OAuth, provider.NewHTTPClient(5*time.Second))),
		usecase.Options{Skew: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := uc.RefreshAhead(context.Background(), repo, 5*time.Minute, 1)
	if err != nil || rep.Refreshed != 3 || rep.Skipped != 3 {
		t.Fatalf("sweep: %+v, %v; want 3 refreshed and 3 skipped", rep, err)
	}
	refreshed := w.Provider.Stats().Refreshes
	for _, name := range names {
		if _, err := uc.Token(context.Background(), name); err != nil {
			t.Errorf("%s: %v (still valid)", name, err)
		}
	}
	if got := w.Provider.Stats().Refreshes - refreshed; got != 1 {
		t.Errorf("callers after the sweep got %d refreshes, want the 1 the sweep left", got)
	}
}
