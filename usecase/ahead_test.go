package usecase

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// pagedAhead serves n due connections a page at a time and counts what the
// sweep asked for.
type pagedAhead struct {
	n        int
	claimErr error // Claim's answer; nil: another holder refreshes it (skipped)

	mu       sync.Mutex
	pages    int
	maxLimit int
	tried    map[string]bool
}

func (p *pagedAhead) ExpiringBefore(_ context.Context, _ time.Time, after string, limit int) ([]domain.Token, string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pages++
	p.maxLimit = max(p.maxLimit, limit)
	from := 0
	if after != "" {
		from, _ = strconv.Atoi(after)
	}
	var due []domain.Token
	for i := from; i < p.n && len(due) < limit; i++ {
		due = append(due, domain.Token{Connection: fmt.Sprintf("c-%d", i), Status: domain.StatusActive, Version: 1, Expiry: time.Now()})
	}
	next := ""
	if len(due) == limit {
		next = strconv.Itoa(from + limit)
	}
	return due, next, nil
}

func (p *pagedAhead) ObtainedBefore(ctx context.Context, t time.Time, after string, limit int) ([]domain.Token, string, error) {
	return p.ExpiringBefore(ctx, t, after, limit)
}

func (p *pagedAhead) Read(context.Context, string) (domain.Token, Lease, error) {
	return domain.Token{}, Lease{}, errors.New("not used: the sweep claims tokens as listed")
}

// Claim finds another holder refreshing every connection (the sweep skips
// it), or fails with claimErr.
func (p *pagedAhead) Claim(_ context.Context, seen domain.Token, _ time.Duration) (Claim, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tried[seen.Connection] {
		return Claim{}, fmt.Errorf("%s tried twice", seen.Connection)
	}
	p.tried[seen.Connection] = true
	return Claim{Token: seen, Lease: Lease{Running: true}}, p.claimErr
}

func (p *pagedAhead) Store(context.Context, domain.Token) (domain.Token, error) {
	return domain.Token{}, errors.New("not used: nothing is refreshed")
}

func (p *pagedAhead) Fail(context.Context, domain.Token, domain.RefreshFailure) error {
	return errors.New("not used: nothing is refreshed")
}

func TestRefreshAheadPagesThroughEveryDueConnection(t *testing.T) {
	u, err := NewRefreshTokenUseCase(nil, nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	const n = 2*sweepPage + 7
	p := &pagedAhead{n: n, tried: map[string]bool{}}
	rep, err := u.RefreshAhead(context.Background(), p, time.Minute, 8)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Due != n || rep.Skipped != n || len(p.tried) != n || p.pages != 3 || p.maxLimit != sweepPage {
		t.Fatalf("report %+v, tried %d, pages %d (limit %d); want %d skipped over 3 pages of %d", rep, len(p.tried), p.pages, p.maxLimit, n, sweepPage)
	}
	// The keep-alive sweep pages the same way.
	p = &pagedAhead{n: n, tried: map[string]bool{}}
	if rep, err = u.KeepAlive(context.Background(), p, time.Hour, 8); err != nil || rep.Due != n || len(p.tried) != n || p.pages != 3 {
		t.Fatalf("keep alive: report %+v, %v, tried %d over %d pages", rep, err, len(p.tried), p.pages)
	}
}

func TestRefreshAheadReturnsAFewErrorsAndCountsTheRest(t *testing.T) {
	u, err := NewRefreshTokenUseCase(nil, nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	const n = sweepPage + 1
	boom := errors.New("database went away")
	p := &pagedAhead{n: n, tried: map[string]bool{}, claimErr: boom}
	rep, err := u.RefreshAhead(context.Background(), p, time.Minute, 4)
	if rep.Failed != n || !errors.Is(err, boom) {
		t.Fatalf("report %+v, err %v", rep, err)
	}
	if got := strings.Count(err.Error(), boom.Error()); got != sweepErrors {
		t.Errorf("%d errors spelled out, want %d", got, sweepErrors)
	}
	if !strings.Contains(err.Error(), fmt.Sprintf("and %d more", n-sweepErrors)) {
		t.Errorf("error does not count the rest: %.200s", err)
	}
}

// idleTokens is an AheadStore over a few stored tokens that records what
// was stored.
type idleTokens struct {
	mu    sync.Mutex
	toks  map[string]domain.Token
	saved []string
}

func (s *idleTokens) ExpiringBefore(context.Context, time.Time, string, int) ([]domain.Token, string, error) {
	return nil, "", nil
}

// ObtainedBefore lists the tokens as the repository does: without their
// credentials.
func (s *idleTokens) ObtainedBefore(_ context.Context, before time.Time, _ string, _ int) ([]domain.Token, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var due []domain.Token
	for _, t := range s.toks {
		if t.ObtainedAt.Before(before) {
			t.AccessToken, t.RefreshToken = domain.Secret{}, domain.Secret{}
			due = append(due, t)
		}
	}
	return due, "", nil
}

func (s *idleTokens) Read(_ context.Context, id string) (domain.Token, Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.toks[id], Lease{}, nil
}

func (s *idleTokens) Claim(_ context.Context, seen domain.Token, _ time.Duration) (Claim, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Claim{Token: s.toks[seen.Connection], End: func(bool) {}}, nil
}

func (s *idleTokens) Store(_ context.Context, t domain.Token) (domain.Token, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t.Version++
	s.toks[t.Connection] = t
	s.saved = append(s.saved, t.Connection)
	return t, nil
}

func (s *idleTokens) Fail(context.Context, domain.Token, domain.RefreshFailure) error {
	panic("no failure")
}

type grantAll struct{}

func (grantAll) Refresh(context.Context, string, domain.Secret) (domain.Grant, error) {
	return domain.Grant{AccessToken: domain.NewSecret("at"), RefreshToken: domain.NewSecret("rt"), Expiry: time.Now().Add(time.Hour)}, nil
}

func TestKeepAliveFollowsEachProvidersOwnInterval(t *testing.T) {
	now := time.Now()
	tok := func(name, provider string, idle time.Duration) domain.Token {
		return domain.Token{Connection: name, Provider: provider, AccessToken: domain.NewSecret("a"), RefreshToken: domain.NewSecret("r"),
			Status: domain.StatusActive, Version: 1, ObtainedAt: now.Add(-idle), Expiry: now.Add(time.Hour)}
	}
	store := &idleTokens{toks: map[string]domain.Token{
		"env-10d":  tok("env-10d", "", 10*24*time.Hour),    // the global 30 days: not yet
		"env-40d":  tok("env-40d", "", 40*24*time.Hour),    // due
		"crm-10d":  tok("crm-10d", "crm", 10*24*time.Hour), // crm keeps alive after 7 days: due
		"crm-2d":   tok("crm-2d", "crm", 2*24*time.Hour),   // not yet
		"mail-40d": tok("mail-40d", "mail", 40*24*time.Hour),
	}}
	u, err := NewRefreshTokenUseCase(nil, grantAll{}, Options{ProviderKeepAlives: func() map[string]time.Duration {
		return map[string]time.Duration{"crm": 7 * 24 * time.Hour, "mail": 60 * 24 * time.Hour}
	}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := u.KeepAlive(context.Background(), store, 30*24*time.Hour, 2); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(sorted(store.saved), " ")
	if got != "crm-10d env-40d" {
		t.Errorf("refreshed %q, want crm-10d env-40d", got)
	}
	// Without a global keep-alive, only crm's run.
	store.saved = nil
	store.toks["env-40d"] = tok("env-40d", "", 40*24*time.Hour)
	store.toks["crm-10d"] = tok("crm-10d", "crm", 10*24*time.Hour)
	if _, err := u.KeepAlive(context.Background(), store, 0, 2); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(sorted(store.saved), " "); got != "crm-10d" {
		t.Errorf("without a global keep-alive refreshed %q, want crm-10d", got)
	}
}

func sorted(s []string) []string {
	out := append([]string(nil), s...)
	slices.Sort(out)
	return out
}

// slowProvider answers every refresh after latency, counting the requests
// at once.
type slowProvider struct {
	latency        time.Duration
	mu             sync.Mutex
	inFlight, peak int
}

func (p *slowProvider) calls() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inFlight
}

func (p *slowProvider) Refresh(ctx context.Context, provider string, rt domain.Secret) (domain.Grant, error) {
	p.mu.Lock()
	p.inFlight++
	p.peak = max(p.peak, p.inFlight)
	p.mu.Unlock()
	time.Sleep(p.latency)
	p.mu.Lock()
	p.inFlight--
	p.mu.Unlock()
	return grantAll{}.Refresh(ctx, provider, rt)
}

// claimsDuringCalls records, at each claim, how many refreshes were at the
// provider.
type claimsDuringCalls struct {
	*idleTokens
	provider *slowProvider
	mu       sync.Mutex
	busiest  int
}

func (s *claimsDuringCalls) Claim(ctx context.Context, seen domain.Token, d time.Duration) (Claim, error) {
	n := s.provider.calls()
	s.mu.Lock()
	s.busiest = max(s.busiest, n)
	s.mu.Unlock()
	return s.idleTokens.Claim(ctx, seen, d)
}

// The sweep's concurrency bounds the requests at the provider, and only
// them: the next connections are claimed while that many are out, so that
// the database work adds nothing to the sweep's time.
func TestSweepBoundsProviderCallsAndClaimsMeanwhile(t *testing.T) {
	const n, concurrency = 40, 3
	now := time.Now()
	toks := map[string]domain.Token{}
	for i := range n {
		id := fmt.Sprintf("c-%d", i)
		toks[id] = domain.Token{Connection: id, AccessToken: domain.NewSecret("a"), RefreshToken: domain.NewSecret("r"),
			Status: domain.StatusActive, Version: 1, ObtainedAt: now.Add(-48 * time.Hour), Expiry: now.Add(time.Hour)}
	}
	provider := &slowProvider{latency: 20 * time.Millisecond}
	store := &claimsDuringCalls{idleTokens: &idleTokens{toks: toks}, provider: provider}
	u, err := NewRefreshTokenUseCase(nil, provider, Options{})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := u.KeepAlive(context.Background(), store, 24*time.Hour, concurrency)
	if err != nil || rep.Refreshed != n {
		t.Fatalf("report %+v, %v; want %d refreshed", rep, err, n)
	}
	if provider.peak > concurrency {
		t.Errorf("%d requests at the provider at once, want at most %d", provider.peak, concurrency)
	}
	if store.busiest < concurrency {
		t.Errorf("claims ran with at most %d requests at the provider: the database work waited for the calls (want claims while %d were out)", store.busiest, concurrency)
	}
}
