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

// outcomes records the outcome of every pass through the lock.
type outcomes struct {
	mu  sync.Mutex
	got []usecase.RefreshOutcome
}

func (o *outcomes) CacheLookup(bool)     {}
func (o *outcomes) ForcedRefresh(string) {}
func (o *outcomes) Invalidated()         {}
func (o *outcomes) Refreshed(e usecase.RefreshEvent) {
	o.mu.Lock()
	o.got = append(o.got, e.Outcome)
	o.mu.Unlock()
}

func TestClientRejectionNeverTouchesTheConnection(t *testing.T) {
	for _, c := range []struct {
		err     *domain.ProviderError
		is      error
		outcome usecase.RefreshOutcome
		check   string
	}{
		{&domain.ProviderError{Code: "invalid_client", HTTPStatus: 401, Class: domain.ClientRejected},
			domain.ErrClientRejected, usecase.OutcomeClientRejected, "OAUTH_CLIENT_SECRET"},
		{&domain.ProviderError{HTTPStatus: 404, Class: domain.EndpointMisconfigured},
			domain.ErrEndpointMisconfigured, usecase.OutcomeEndpointMisconfigured, "OAUTH_TOKEN_URL"},
	} {
		t.Run(string(c.outcome), func(t *testing.T) {
			clock := &fakeClock{now: t0}
			store := &fakeStore{tok: domain.Token{Connection: "acme", AccessToken: domain.NewSecret("at-1"), RefreshToken: domain.NewSecret("rt-1"),
				TokenType: "Bearer", ObtainedAt: t0.Add(-time.Hour), Expiry: t0.Add(10 * time.Second), Version: 1, Status: domain.StatusActive}}
			ref := &fakeRefresher{err: c.err, grant: domain.Grant{AccessToken: domain.NewSecret("at-2"), RefreshToken: domain.NewSecret("rt-2"), Expiry: t0.Add(time.Hour)}}
			var logs syncBuffer
			obs := &outcomes{}
			hooked := 0
			uc, err := usecase.NewRefreshTokenUseCase(store, ref, usecase.Options{Clock: clock, Observer: obs,
				Logger:        slog.New(slog.NewTextHandler(&logs, nil)),
				OnNeedsReauth: func(string, string) { hooked++ }})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			before := store.tok

			// Inside the skew: the still-valid token is served.
			tok, err := uc.Token(ctx, "acme")
			if err != nil || tok.Version != 1 || ref.calls != 1 {
				t.Fatalf("inside the skew: v%d, %v, provider calls %d; want the current token after one call", tok.Version, err, ref.calls)
			}
			// Paused: no provider call, still served.
			clock.now = clock.now.Add(100 * time.Millisecond)
			if tok, err := uc.Token(ctx, "acme"); err != nil || tok.Version != 1 || ref.calls != 1 {
				t.Fatalf("in the pause: v%d, %v, provider calls %d", tok.Version, err, ref.calls)
			}
			// Expired: callers get the typed error; forced refreshes too.
			clock.now = t0.Add(11 * time.Second)
			if _, err := uc.Token(ctx, "acme"); !errors.Is(err, c.is) || errors.Is(err, domain.ErrNeedsReauth) {
				t.Errorf("expired: err = %v, want %v", err, c.is)
			}
			if _, err := uc.ForceRefresh(ctx, "acme", 1); !errors.Is(err, c.is) {
				t.Errorf("forced: err = %v, want %v", err, c.is)
			}
			if store.tok != before || len(store.saves) != 0 || hooked != 0 {
				t.Errorf("connection touched: %+v, %d saves, %d hook calls", store.tok, len(store.saves), hooked)
			}
			// Repeated rejections lengthen the pause, up to a few seconds.
			var gaps []time.Duration
			last, calls := clock.now, ref.calls
			for range 200 {
				clock.now = clock.now.Add(50 * time.Millisecond)
				_, _ = uc.Token(ctx, "acme")
				if ref.calls != calls {
					gaps, last, calls = append(gaps, clock.now.Sub(last)), clock.now, ref.calls
				}
			}
			t.Logf("provider called after pauses of %v", gaps)
			if len(gaps) < 4 || gaps[len(gaps)-1] <= gaps[0] || gaps[len(gaps)-1] > 3*time.Second {
				t.Errorf("pauses %v: want growing, capped at a few seconds", gaps)
			}
			// One ERROR line (naming the setting) for all of this, another a minute later.
			if n := strings.Count(logs.String(), "level=ERROR"); n != 1 || strings.Count(logs.String(), c.check) < 1 {
				t.Errorf("%d ERROR lines, want 1 naming %s:\n%s", n, c.check, logs.String())
			}
			clock.now = clock.now.Add(time.Minute)
			_, _ = uc.Token(ctx, "acme")
			if n := strings.Count(logs.String(), "level=ERROR"); n != 2 {
				t.Errorf("%d ERROR lines after a minute, want 2", n)
			}
			// The provider accepts the client again: the next call after
			// the pause refreshes, and a success ends the pauses.
			ref.mu.Lock()
			ref.err = nil
			ref.mu.Unlock()
			clock.now = clock.now.Add(3 * time.Second)
			if tok, err := uc.Token(ctx, "acme"); err != nil || tok.Version != 2 {
				t.Fatalf("after recovery: v%d, %v", tok.Version, err)
			}
			obs.mu.Lock()
			defer obs.mu.Unlock()
			seen := map[usecase.RefreshOutcome]int{}
			for _, o := range obs.got {
				seen[o]++
			}
			if seen[c.outcome] == 0 || seen[usecase.OutcomeOK] != 1 || seen[usecase.OutcomeInvalidGrant] != 0 {
				t.Errorf("outcomes %v", seen)
			}
		})
	}
}

// A token that lives 3 s, shorter than ForceInterval: every lifetime can
// end in a 401 and a forced refresh, and each is allowed. A second 401 for
// the same young token is not (an API that answers 401 to everything).
func TestForcedRefreshIntervalFollowsGrantedLifetime(t *testing.T) {
	uc, store, ref, clock := setup(t, time.Hour)
	store.tok.ObtainedAt, store.tok.Expiry = t0, t0.Add(3*time.Second)
	ctx := context.Background()
	for i := range 4 {
		clock.now = clock.now.Add(3 * time.Second)
		ref.mu.Lock()
		ref.grant.Expiry = clock.now.Add(3 * time.Second)
		ref.mu.Unlock()
		v := store.tok.Version
		tok, err := uc.ForceRefresh(ctx, "acme", v)
		if err != nil || tok.Version != v+1 {
			t.Fatalf("lifetime %d: forced refresh v%d, %v", i, tok.Version, err)
		}
	}
	clock.now = clock.now.Add(100 * time.Millisecond)
	if _, err := uc.ForceRefresh(ctx, "acme", store.tok.Version); !errors.Is(err, domain.ErrRefreshRateLimited) {
		t.Errorf("second 401 100ms after a forced refresh: %v, want rate limited", err)
	}
	if ref.calls != 4 {
		t.Errorf("provider called %d times, want 4", ref.calls)
	}
}
