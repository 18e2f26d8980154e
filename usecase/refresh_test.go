package usecase_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/usecase"
)

// Unit tests of the decision logic with small hand-written fakes. The
// behaviour against a real Postgres and a real provider is in
// refresh_integration_test.go.

type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time { return c.now }

type fakeStore struct {
	mu      sync.Mutex
	tok     domain.Token
	locks   int
	saves   []domain.Token
	lockErr error
	// failCommits makes that many otherwise successful transactions fail
	// at commit (and roll back).
	failCommits int
	// lostCommits makes that many transactions commit but report failure,
	// as when the answer to COMMIT is lost with the connection.
	lostCommits int
	// beforeRelock runs in each locked transaction before anything else,
	// to simulate another process finishing a refresh while we waited.
	beforeRelock func(*domain.Token)
	// leasedElsewhere makes that many claims find another process's
	// lease; leases and releases count the others.
	leasedElsewhere, leases, releases int
	whys                              []string // what leases noted (Claim.Why)
}

func (s *fakeStore) Get(_ context.Context, id string) (domain.Token, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if id != s.tok.Connection {
		return domain.Token{}, domain.ErrNotFound
	}
	return s.tok, nil
}

// Read: the fake keeps no leases that another process could hold.
func (s *fakeStore) Read(ctx context.Context, id string) (domain.Token, usecase.Lease, error) {
	t, err := s.Get(ctx, id)
	return t, usecase.Lease{}, err
}

// locked counts a locked transaction and runs beforeRelock in it.
func (s *fakeStore) locked() error {
	if s.lockErr != nil {
		return s.lockErr
	}
	s.locks++
	if s.beforeRelock != nil {
		s.beforeRelock(&s.tok)
	}
	return nil
}

// Claim leases seen's version unless leasedElsewhere says another
// process's lease runs.
func (s *fakeStore) Claim(_ context.Context, seen domain.Token, _ time.Duration) (usecase.Claim, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.locked(); err != nil {
		return usecase.Claim{}, err
	}
	c := usecase.Claim{Token: s.tok}
	switch {
	case s.tok.Version != seen.Version || s.tok.Failure.Failures != seen.Failure.Failures || s.tok.Status != domain.StatusActive:
		return c, nil
	case s.leasedElsewhere > 0:
		s.leasedElsewhere--
		c.Lease.Running = true
		return c, nil
	}
	s.leases++
	var once sync.Once
	c.End = func(release bool) {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if release {
				s.releases++
			}
		})
	}
	c.Why = func(reason string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.whys = append(s.whys, reason)
	}
	return c, nil
}

// Store writes t if the version is still t.Version; failCommits and
// lostCommits make writes fail at commit (rolled back) or commit with
// their answer lost.
func (s *fakeStore) Store(_ context.Context, t domain.Token) (domain.Token, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.locked(); err != nil {
		return domain.Token{}, err
	}
	if t.Version != s.tok.Version {
		return domain.Token{}, domain.ErrConflict
	}
	if s.failCommits > 0 {
		s.failCommits--
		return domain.Token{}, errors.New("commit failed: connection reset")
	}
	if t.RefreshToken.IsZero() {
		t.RefreshToken = s.tok.RefreshToken
	}
	t.Version++
	t.Failure = domain.RefreshFailure{}
	s.tok = t
	s.saves = append(s.saves, t)
	if s.lostCommits > 0 {
		s.lostCommits--
		return domain.Token{}, errors.New("commit: connection reset (outcome unknown)")
	}
	return t, nil
}

// Fail keeps the failure episode on the token, as the repository keeps it
// with its version.
func (s *fakeStore) Fail(_ context.Context, t domain.Token, f domain.RefreshFailure) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.locked(); err != nil {
		return err
	}
	if t.Version != s.tok.Version {
		return domain.ErrConflict
	}
	s.tok.Failure = f
	s.releases++
	return nil
}

type fakeRefresher struct {
	mu    sync.Mutex
	calls int
	grant domain.Grant
	err   error
}

func (r *fakeRefresher) Refresh(_ context.Context, _ string, rt domain.Secret) (domain.Grant, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	return r.grant, r.err
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func setup(t *testing.T, expiresIn time.Duration) (*usecase.RefreshTokenUseCase, *fakeStore, *fakeRefresher, *fakeClock) {
	t.Helper()
	store := &fakeStore{tok: domain.Token{
		Connection: "acme", AccessToken: domain.NewSecret("at-1"), RefreshToken: domain.NewSecret("rt-1"),
		TokenType: "Bearer", ObtainedAt: t0.Add(-time.Hour), Expiry: t0.Add(expiresIn), Version: 1, Status: domain.StatusActive,
	}}
	ref := &fakeRefresher{grant: domain.Grant{
		AccessToken: domain.NewSecret("at-2"), RefreshToken: domain.NewSecret("rt-2"), TokenType: "Bearer", Expiry: t0.Add(time.Hour),
	}}
	clock := &fakeClock{now: t0}
	uc, err := usecase.NewRefreshTokenUseCase(store, ref, usecase.Options{Skew: 30 * time.Second, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	return uc, store, ref, clock
}

func TestFreshTokenIsReusedWithoutLock(t *testing.T) {
	uc, store, ref, _ := setup(t, time.Minute)
	tok, err := uc.Token(context.Background(), "acme")
	if err != nil || tok.AccessToken.Reveal() != "at-1" {
		t.Fatalf("Token = %v, %v", tok, err)
	}
	if store.locks != 0 || ref.calls != 0 {
		t.Errorf("locks=%d refreshes=%d, want 0 0", store.locks, ref.calls)
	}
}

func TestStaleTokenIsRefreshedAndRotatedTokenPersisted(t *testing.T) {
	uc, store, ref, _ := setup(t, 10*time.Second) // inside the 30s skew
	tok, err := uc.Token(context.Background(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	// Two short transactions: the lease, then the write.
	if ref.calls != 1 || store.locks != 2 || len(store.saves) != 1 {
		t.Fatalf("refreshes=%d locks=%d saves=%d, want 1 2 1", ref.calls, store.locks, len(store.saves))
	}
	if tok.AccessToken.Reveal() != "at-2" || !tok.RefreshToken.IsZero() || tok.Version != 2 || !tok.ObtainedAt.Equal(t0) {
		t.Errorf("got %+v", tok)
	}
	if store.tok.RefreshToken.Reveal() != "rt-2" {
		t.Errorf("rotated refresh token not stored")
	}
}

func TestRecheckAfterLockSkipsRefreshDoneByAnotherProcess(t *testing.T) {
	uc, store, ref, _ := setup(t, 10*time.Second)
	store.beforeRelock = func(tk *domain.Token) {
		tk.AccessToken, tk.Expiry, tk.Version = domain.NewSecret("at-other"), t0.Add(time.Hour), 2
	}
	tok, err := uc.Token(context.Background(), "acme")
	if err != nil || tok.AccessToken.Reveal() != "at-other" {
		t.Fatalf("Token = %v, %v", tok, err)
	}
	if ref.calls != 0 || len(store.saves) != 0 {
		t.Errorf("refreshed although another process had: refreshes=%d saves=%d", ref.calls, len(store.saves))
	}
}

func TestProviderWithoutRotationKeepsRefreshToken(t *testing.T) {
	uc, store, ref, _ := setup(t, 0)
	ref.grant.RefreshToken = domain.Secret{}
	if _, err := uc.Token(context.Background(), "acme"); err != nil {
		t.Fatal(err)
	}
	if got := store.tok.RefreshToken.Reveal(); got != "rt-1" {
		t.Errorf("refresh token = %q, want the old one kept", got)
	}
}

func TestInvalidGrantMarksNeedsReauthOnce(t *testing.T) {
	uc, store, ref, _ := setup(t, 0)
	ref.err = &domain.ProviderError{Code: "invalid_grant", HTTPStatus: 400, Class: domain.GrantDead}
	_, err := uc.Token(context.Background(), "acme")
	if !errors.Is(err, domain.ErrNeedsReauth) || !errors.Is(err, domain.ErrGrantRevoked) {
		t.Fatalf("err = %v, want ErrNeedsReauth and ErrGrantRevoked", err)
	}
	if store.tok.Status != domain.StatusNeedsReauth || store.tok.StatusReason != "invalid_grant" {
		t.Errorf("stored status = %q (%q)", store.tok.Status, store.tok.StatusReason)
	}
	if store.tok.RefreshToken.Reveal() != "rt-1" {
		t.Errorf("refresh token not kept for forensics")
	}
	// Later calls fail fast without calling the provider.
	_, err = uc.Token(context.Background(), "acme")
	if !errors.Is(err, domain.ErrNeedsReauth) || ref.calls != 1 {
		t.Errorf("second call: err=%v provider calls=%d, want ErrNeedsReauth and 1", err, ref.calls)
	}
}

func TestTransientProviderErrorLeavesTokenUntouched(t *testing.T) {
	uc, store, ref, _ := setup(t, 0)
	ref.err = &domain.ProviderError{HTTPStatus: 503, Code: "temporarily_unavailable"}
	_, err := uc.Token(context.Background(), "acme")
	if !errors.Is(err, domain.ErrProviderUnavailable) {
		t.Fatalf("err = %v, want ErrProviderUnavailable", err)
	}
	if len(store.saves) != 0 || store.tok.Version != 1 {
		t.Errorf("token written after a transient failure")
	}
	ref.err = nil
	if tok, err := uc.Token(context.Background(), "acme"); err != nil || tok.AccessToken.Reveal() != "at-2" {
		t.Errorf("next call = %v, %v; want success", tok, err)
	}
}

func TestCancelledCallerDoesNotRedeem(t *testing.T) {
	uc, _, ref, _ := setup(t, 0)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	// The fake store does not look at ctx; the use case must check it
	// before spending the refresh token.
	if _, err := uc.Token(ctx, "acme"); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if ref.calls != 0 {
		t.Errorf("provider called for a cancelled caller")
	}
}

func TestErrorsPassThrough(t *testing.T) {
	uc, store, _, _ := setup(t, 0)
	if _, err := uc.Token(context.Background(), "nope"); !errors.Is(err, domain.ErrNotFound) {
		t.Errorf("unknown connection: err = %v", err)
	}
	store.lockErr = domain.ErrLockTimeout
	if _, err := uc.Token(context.Background(), "acme"); !errors.Is(err, domain.ErrLockTimeout) {
		t.Errorf("lock timeout: err = %v", err)
	}
}

func TestOptionsValidation(t *testing.T) {
	for name, o := range map[string]usecase.Options{
		"refresh timeout not shorter than lock wait": {LockWait: time.Second, RefreshTimeout: time.Second},
		"negative skew": {Skew: -time.Second},
	} {
		if _, err := usecase.NewRefreshTokenUseCase(&fakeStore{}, &fakeRefresher{}, o); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := usecase.NewRefreshTokenUseCase(&fakeStore{}, &fakeRefresher{}, usecase.Options{LockWait: 3 * time.Second}); err != nil {
		t.Errorf("defaults derived from a short lock wait rejected: %v", err)
	}
}

func TestForceRefreshAfter401(t *testing.T) {
	uc, store, ref, _ := setup(t, time.Hour) // fresh by the skew rule
	ctx := context.Background()

	// Someone already stored a newer token: no refresh.
	store.tok.Version = 5
	tok, err := uc.ForceRefresh(ctx, "acme", 4)
	if err != nil || tok.Version != 5 || ref.calls != 0 {
		t.Fatalf("newer stored token: %v v%d, provider calls %d", err, tok.Version, ref.calls)
	}

	// A burst of 401s for the stored version causes one refresh.
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if tok, err := uc.ForceRefresh(ctx, "acme", 5); err != nil || tok.Version != 6 {
				t.Errorf("ForceRefresh = v%d, %v", tok.Version, err)
			}
		})
	}
	wg.Wait()
	if ref.calls != 1 {
		t.Errorf("provider called %d times for one burst", ref.calls)
	}

	// An API that keeps answering 401 cannot drive a refresh loop.
	_, err = uc.ForceRefresh(ctx, "acme", 6)
	if !errors.Is(err, domain.ErrRefreshRateLimited) || ref.calls != 1 {
		t.Errorf("second forced refresh within the interval: %v, provider calls %d", err, ref.calls)
	}
}

func TestNeedsReauthHookFiresOnce(t *testing.T) {
	store := &fakeStore{tok: domain.Token{Connection: "acme", AccessToken: domain.NewSecret("a"), RefreshToken: domain.NewSecret("r"),
		Version: 1, Status: domain.StatusActive, Expiry: t0}}
	ref := &fakeRefresher{err: &domain.ProviderError{Code: "invalid_grant", Class: domain.GrantDead}}
	var calls []string
	uc, err := usecase.NewRefreshTokenUseCase(store, ref, usecase.Options{Clock: &fakeClock{now: t0},
		OnNeedsReauth: func(id, reason string) { calls = append(calls, id+":"+reason) }})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		_, _ = uc.Token(context.Background(), "acme")
	}
	if len(calls) != 1 || calls[0] != "acme:invalid_grant" {
		t.Errorf("hook calls = %v, want one", calls)
	}
}

func TestRotatedTokenSurvivesFailedCommit(t *testing.T) {
	uc, store, ref, _ := setup(t, 0)
	store.failCommits = 2 // the refresh's commit and the first rescue attempt
	tok, err := uc.Token(context.Background(), "acme")
	if err != nil {
		t.Fatalf("Token: %v", err)
	}
	if ref.calls != 1 {
		t.Errorf("provider called %d times", ref.calls)
	}
	if !tok.RefreshToken.IsZero() {
		t.Error("Token handed out the refresh token")
	}
	if store.tok.RefreshToken.Reveal() != "rt-2" || store.tok.Version != 2 {
		t.Errorf("rotated token not persisted: stored %q v%d", store.tok.RefreshToken.Reveal(), store.tok.Version)
	}
}

// The commit went through but its answer was lost: the rescue finds the
// rotated token stored and says so, instead of reporting it dropped or
// storing it twice.
func TestRescueRecognisesACommitWhoseAnswerWasLost(t *testing.T) {
	_, store, ref, clock := setup(t, 0)
	store.lostCommits = 1
	var logs syncBuffer
	uc, err := usecase.NewRefreshTokenUseCase(store, ref, usecase.Options{Skew: 30 * time.Second, Clock: clock,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := uc.Token(context.Background(), "acme")
	if err != nil {
		t.Fatalf("Token: %v", err)
	}
	if ref.calls != 1 || len(store.saves) != 1 || store.tok.Version != 2 || tok.Version != 2 || store.tok.RefreshToken.Reveal() != "rt-2" {
		t.Errorf("provider calls %d, saves %d, stored v%d, got v%d", ref.calls, len(store.saves), store.tok.Version, tok.Version)
	}
	if strings.Contains(logs.String(), "dropped") {
		t.Errorf("reported a stored token as dropped:\n%s", logs.String())
	}
}

func TestRescueGivesWayToANewerToken(t *testing.T) {
	uc, store, _, _ := setup(t, 0)
	store.failCommits = 1
	store.beforeRelock = func(tk *domain.Token) {
		// From the rescue attempt on, another grant is stored.
		if tk.Version == 1 && store.locks > 2 {
			tk.Version, tk.RefreshToken = 7, domain.NewSecret("rt-other")
		}
	}
	_, err := uc.Token(context.Background(), "acme")
	if !errors.Is(err, domain.ErrConflict) {
		t.Fatalf("err = %v, want ErrConflict", err)
	}
	if store.tok.RefreshToken.Reveal() != "rt-other" {
		t.Errorf("the rescue overwrote a newer token")
	}
}

// The write of a rotated token failed and the lock went with it; another
// process took the lock, presented the refresh token this one had already
// spent, was told invalid_grant and stored needs_reauth. The rescue still
// stores the rotated token, the only live one, and says so. Had anything
// else been stored meanwhile (a new grant), the rotated token is dropped.
func TestRescueStoresTheRotatedTokenOverAWaitersNeedsReauth(t *testing.T) {
	for _, tc := range []struct {
		name      string
		storedRT  string
		wantSaved bool
	}{
		{"stored refresh token is the spent one", "rt-1", true},
		{"something else was stored", "rt-new-grant", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, store, ref, clock := setup(t, 0)
			store.failCommits = 1
			locks := 0
			store.beforeRelock = func(tk *domain.Token) {
				if locks++; locks == 3 { // the rescue's first attempt (after the lease and the write)
					tk.Status, tk.StatusReason, tk.Version = domain.StatusNeedsReauth, "invalid_grant", tk.Version+1
					tk.RefreshToken = domain.NewSecret(tc.storedRT)
				}
			}
			var logs syncBuffer
			uc, err := usecase.NewRefreshTokenUseCase(store, ref, usecase.Options{Skew: 30 * time.Second, Clock: clock,
				Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			tok, err := uc.Token(context.Background(), "acme")
			if !tc.wantSaved {
				if err == nil || store.tok.Status != domain.StatusNeedsReauth || !strings.Contains(logs.String(), "dropped") {
					t.Fatalf("Token = %v, %v; stored %s: want the rotated token dropped, loudly", tok.Version, err, store.tok.Status)
				}
				return
			}
			if err != nil || tok.AccessToken.Reveal() != "at-2" {
				t.Fatalf("Token = %v, %v", tok.Version, err)
			}
			if store.tok.Status != domain.StatusActive || store.tok.RefreshToken.Reveal() != "rt-2" || store.tok.Version != 3 {
				t.Errorf("stored %s %q v%d, want active rt-2 v3", store.tok.Status, store.tok.RefreshToken.Reveal(), store.tok.Version)
			}
			if !strings.Contains(logs.String(), "storing the rotated token instead") || !strings.Contains(logs.String(), "level=ERROR") {
				t.Errorf("not said loudly:\n%s", logs.String())
			}
			if ref.calls != 1 {
				t.Errorf("provider called %d times", ref.calls)
			}
		})
	}
}

func TestLeaseHeldElsewhereIsWaitedFor(t *testing.T) {
	uc, store, ref, _ := setup(t, 10*time.Second)
	store.leasedElsewhere = 2 // the other process's refresh ends during the third look
	if _, err := uc.Token(context.Background(), "acme"); err != nil {
		t.Fatal(err)
	}
	if store.locks != 4 || ref.calls != 1 || store.leases != 1 || store.releases != 0 {
		t.Errorf("locks=%d refreshes=%d leases=%d releases=%d, want 4 (three looks, one write) 1 1 0", store.locks, ref.calls, store.leases, store.releases)
	}
}

func TestLeaseNeverEndingServesTheValidTokenThenTimesOut(t *testing.T) {
	store := &fakeStore{leasedElsewhere: 1 << 30, tok: domain.Token{
		Connection: "acme", AccessToken: domain.NewSecret("at-1"), RefreshToken: domain.NewSecret("rt-1"),
		ObtainedAt: t0.Add(-time.Hour), Expiry: t0.Add(10 * time.Second), Version: 1, Status: domain.StatusActive,
	}}
	ref := &fakeRefresher{}
	clock := &fakeClock{now: t0}
	uc, err := usecase.NewRefreshTokenUseCase(store, ref, usecase.Options{Skew: 30 * time.Second, Clock: clock,
		LockWait: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// Not expired yet: served, the refresh token left alone.
	if tok, err := uc.Token(context.Background(), "acme"); err != nil || tok.AccessToken.Reveal() != "at-1" {
		t.Fatalf("Token = %v, %v; want the stored token", tok.AccessToken, err)
	}
	clock.now = t0.Add(11 * time.Second) // expired
	_, err = uc.Token(context.Background(), "acme")
	if !errors.Is(err, domain.ErrLockTimeout) || !errors.Is(err, domain.ErrRefreshInProgress) {
		t.Fatalf("err = %v, want a lock timeout caused by the lease", err)
	}
	if ref.calls != 0 {
		t.Errorf("the refresh token was presented %d times under another process's lease", ref.calls)
	}
}

func TestLeaseReleasedWhenTheTokenWasNotSpent(t *testing.T) {
	uc, store, ref, _ := setup(t, 0)
	ref.err = &domain.ProviderError{HTTPStatus: 503, Class: domain.Transient}
	if _, err := uc.Token(context.Background(), "acme"); !errors.Is(err, domain.ErrProviderUnavailable) {
		t.Fatalf("err = %v", err)
	}
	if store.leases != 1 || store.releases != 1 {
		t.Errorf("leases=%d releases=%d, want 1 1", store.leases, store.releases)
	}
}
