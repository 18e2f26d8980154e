package repository_test

import (
	"context"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// budgetRows reads the token budgets: provider -> requests debited.
func budgetRows(t *testing.T, db *gorm.DB) map[string]int {
	t.Helper()
	var rows []struct {
		Provider string
		N        int
	}
	if err := db.Raw("SELECT provider, cardinality(spent) AS n FROM tokenguard_token_budgets").Find(&rows).Error; err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, r := range rows {
		out[r.Provider] = r.N
	}
	return out
}

// claimN claims the refresh of each token, ending the leases taken, and
// returns how many were leased and the budget waits of the others.
func claimN(ctx context.Context, t *testing.T, r *repository.TokenRepository, toks []domain.Token) (leased int, waits []time.Duration) {
	t.Helper()
	for _, tok := range toks {
		c, err := r.Claim(ctx, tok, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if c.End != nil {
			c.End(true)
			leased++
			if c.BudgetWait != 0 {
				t.Errorf("leased with a budget wait %v", c.BudgetWait)
			}
			continue
		}
		waits = append(waits, c.BudgetWait)
	}
	return leased, waits
}

// A provider's budget is one row, debited by the claims that take a
// lease and by no other: the OAUTH_* provider's from SetTokenRate, a
// stored provider's from its row; a provider without one gets no row. A
// spent budget refuses the lease, saying how long until it may not; the
// sweep's claims leave a quarter to callers; a shrink after a 429 spends
// the rest for its Retry-After.
func TestTokenBudgetOneRowPerProvider(t *testing.T) {
	r, db, _ := newRepo(t)
	ctx := context.Background()
	r.SetTokenRate(domain.TokenRate{Limit: 4, Period: time.Minute})
	providers := repository.NewProviderRepository(db, tokencrypt.Plaintext{})
	for name, rate := range map[string]domain.TokenRate{"budgeted": {Limit: 2, Period: time.Minute}, "free": {}} {
		if _, err := providers.Add(ctx, domain.Provider{Name: name, TokenURL: "https://idp.example/token", ClientID: "c",
			ClientSecret: domain.NewSecret("s"), TokenRate: rate}); err != nil {
			t.Fatal(err)
		}
	}
	if p, err := providers.Get(ctx, "budgeted"); err != nil || p.TokenRate != (domain.TokenRate{Limit: 2, Period: time.Minute}) {
		t.Fatalf("stored rate: %v, %v", p.TokenRate, err)
	}
	toks := func(provider string, n int) []domain.Token {
		var out []domain.Token
		for i := range n {
			tok := grantToken(provider+"-"+string(rune('a'+i)), "at", "rt")
			if provider != "env" {
				tok.Provider = provider
			}
			out = append(out, put(t, r, tok))
		}
		return out
	}
	env, budgeted, free := toks("env", 6), toks("budgeted", 3), toks("free", 5)

	// The sweep may spend 4 - 1 of the OAUTH_* provider's 4.
	if leased, waits := claimN(usecase.SpareBudget(ctx), t, r, env[:4]); leased != 3 || len(waits) != 1 || waits[0] < 55*time.Second || waits[0] > 64*time.Second {
		t.Errorf("sweep: %d leased, waits %v; want 3 and one of about a minute", leased, waits)
	}
	if leased, waits := claimN(ctx, t, r, env[3:]); leased != 1 || len(waits) != 2 {
		t.Errorf("callers: %d leased, waits %v; want the last 1", leased, waits)
	}
	if leased, waits := claimN(ctx, t, r, budgeted); leased != 2 || len(waits) != 1 {
		t.Errorf("stored provider: %d leased, waits %v; want 2", leased, waits)
	}
	if leased, _ := claimN(ctx, t, r, free); leased != 5 {
		t.Errorf("provider without a budget: %d of 5 leased", leased)
	}
	if got := budgetRows(t, db); len(got) != 2 || got[""] != 4 || got["budgeted"] != 2 {
		t.Errorf("budget rows %v, want {'': 4, budgeted: 2}", got)
	}

	// A shrink spends what is left for its Retry-After, and only where
	// there is a budget.
	r.SetTokenRate(domain.TokenRate{Limit: 100, Period: time.Minute})
	if ok, err := r.ShrinkBudget(ctx, "", 30*time.Second); err != nil || !ok {
		t.Fatalf("shrink: %v, %v", ok, err)
	}
	if ok, err := r.ShrinkBudget(ctx, "free", time.Second); err != nil || ok {
		t.Errorf("shrink of a provider without a budget: %v, %v", ok, err)
	}
	if leased, waits := claimN(ctx, t, r, env[5:]); leased != 0 || len(waits) != 1 || waits[0] < 25*time.Second || waits[0] > 31*time.Second {
		t.Errorf("after a shrink of 30s: %d leased, waits %v", leased, waits)
	}
}
