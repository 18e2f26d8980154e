package usecase_test

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/infra/provider/profiles"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/testworld"
	"github.com/tokenguard/tokenguard/usecase"
)

// movingClock is the clock every stack of a test decides with; the test
// moves it instead of waiting.
type movingClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *movingClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *movingClock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// profiledStack is a stack whose refresher is built as the apps build it
// for profile: the Refresher with the profile, inside Retrying with the
// profile's policy, its HTTP client bounded by the answer deadline (3 s
// when opts leave it to the default).
func profiledStack(t testing.TB, w *testworld.World, opts usecase.Options, profile string) *testworld.Stack {
	t.Helper()
	prof, err := profiles.Get(profile)
	if err != nil {
		t.Fatal(err)
	}
	ref := provider.NewRetrying(provider.NewRefresher(w.OAuth, provider.NewHTTPClient(cmp.Or(opts.AnswerDeadline, 3*time.Second)),
		provider.WithProfile(prof), provider.WithClock(opts.Clock.Now)), retryPolicyFor(prof, opts))
	return w.StackWith(t, ref, opts)
}

func outboxCount(t testing.TB, s *testworld.Stack, kind string) int {
	t.Helper()
	var n int
	if err := s.DB.Raw(`SELECT count(*) FROM tokenguard_webhook_outbox WHERE type = ? AND connection = ?`, kind, conn).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

// drive moves the clock from `from` to `to` in steps of step and, at each
// step, calls Token from callers goroutines of every stack: a call rate
// far above anything a provider should see. Every error must leave the
// grant alone (never needs_reauth). after runs after each step.
func drive(t *testing.T, stacks []*testworld.Stack, clock *movingClock, from, to time.Time, step time.Duration, callers int, after func()) (served, failed int) {
	t.Helper()
	var mu sync.Mutex
	for at := from; at.Before(to); at = at.Add(step) {
		clock.set(at)
		var wg sync.WaitGroup
		for _, s := range stacks {
			for range callers {
				wg.Go(func() {
					_, err := s.UC.Token(context.Background(), conn)
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err == nil:
						served++
					case errors.Is(err, domain.ErrNeedsReauth) || !errors.Is(err, domain.ErrProviderUnavailable):
						t.Errorf("at +%v: %v", at.Sub(from), err)
					default:
						failed++
					}
				})
			}
		}
		wg.Wait()
		if after != nil {
			after()
		}
	}
	return served, failed
}

// An unknown refusal ({"error":"account_under_review"}) neither kills the
// grant nor hammers the provider: over the first minute, three processes
// calling 4 at a time every 250 ms send at most 6 refresh requests (the
// bound in docs/operations.md), the still-valid access token is served
// while it lasts, and the connection is shown failing, with one
// connection.refresh_failing event; after that, at most one request a
// minute; the next success makes it active again (connection.recovered).
func TestUnknownRefusalIsFailingWithinTheBound(t *testing.T) {
	w, stacks, clock, asked := unknownCodeWorld(t)
	expiry := stored(t, stacks[0]).Expiry
	// Stale 30 s before the expiry (skew 1 m): served, then expired.
	start := expiry.Add(-30 * time.Second)
	served, failed := drive(t, stacks, clock, start, start.Add(time.Minute), 250*time.Millisecond, 4, nil)
	firstMinute := asked.Load()
	t.Logf("first minute: %d refresh requests at the provider; %d calls served the still-valid token, %d failed (expired)", firstMinute, served, failed)
	if firstMinute > 6 || firstMinute < 1 {
		t.Errorf("refresh requests in the first minute: %d, want 1 to 6", firstMinute)
	}
	if served == 0 || failed == 0 {
		t.Errorf("served %d, failed %d: want the valid token served, then errors once expired", served, failed)
	}

	c, err := stacks[1].Repo.Connection(context.Background(), conn)
	if err != nil {
		t.Fatal(err)
	}
	if c.Status != domain.StatusFailing || !c.Failure.Failing || c.Failure.HTTPStatus != 400 || c.Failure.Code != "unrecognized_error" {
		t.Errorf("connection %+v: want failing with HTTP 400 unrecognized_error", c)
	}
	if tok := stored(t, stacks[2]); tok.Status != domain.StatusActive {
		t.Errorf("stored status %s: the grant must stay untouched", tok.Status)
	}
	_, err = stacks[0].UC.Token(context.Background(), conn)
	if !errors.Is(err, domain.ErrRefreshFailing) {
		t.Errorf("Token while backing off: %v, want ErrRefreshFailing", err)
	}

	// Then at most one request a minute.
	drive(t, stacks, clock, start.Add(time.Minute), start.Add(4*time.Minute), time.Second, 2, nil)
	if later := asked.Load() - firstMinute; later > 3 {
		t.Errorf("%d refresh requests in the next 3 minutes, want at most one a minute", later)
	}
	if n := outboxCount(t, stacks[0], "connection.refresh_failing"); n != 1 {
		t.Errorf("connection.refresh_failing events: %d, want 1", n)
	}

	// The provider answers again: the next attempt succeeds.
	w.Provider.SetRefreshFault(nil)
	clock.set(start.Add(6 * time.Minute))
	tok, err := stacks[2].UC.Token(context.Background(), conn)
	if err != nil {
		t.Fatalf("after the provider recovered: %v", err)
	}
	if w.CallResource(t, tok.AccessToken.Reveal()) != 200 {
		t.Error("the refreshed token is not accepted")
	}
	if c, _ := stacks[0].Repo.Connection(context.Background(), conn); c.Status != domain.StatusActive || c.Failure.Failures != 0 {
		t.Errorf("after a success: %+v, want active without a failure", c)
	}
	if n := outboxCount(t, stacks[0], "connection.recovered"); n != 1 {
		t.Errorf("connection.recovered events: %d, want 1", n)
	}
}

// The control: the same minute with the failure episode forgotten after
// every step (a backoff kept nowhere, or in one process's memory) asks the
// provider far more often than the bound: the database is what holds it.
func TestUnknownRefusalControlWithoutStoredBackoff(t *testing.T) {
	_, stacks, clock, asked := unknownCodeWorld(t)
	start := stored(t, stacks[0]).Expiry.Add(-30 * time.Second)
	drive(t, stacks, clock, start, start.Add(time.Minute), 250*time.Millisecond, 4, func() {
		if err := stacks[0].DB.Exec(`DELETE FROM tokenguard_refresh_failures`).Error; err != nil {
			t.Fatal(err)
		}
	})
	if n := asked.Load(); n <= 6 {
		t.Errorf("without the stored backoff: %d refresh requests in a minute; the bound test could not fail", n)
	} else {
		t.Logf("without the stored backoff: %d refresh requests in a minute", n)
	}
}

func unknownCodeWorld(t *testing.T) (*testworld.World, []*testworld.Stack, *movingClock, *atomic.Int64) {
	t.Helper()
	p, err := sandbox.New(sandbox.Options{AccessTokenLifespan: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	w := testworld.With(t, p)
	clock := &movingClock{now: time.Now()}
	opts := usecase.Options{Clock: clock, Skew: time.Minute, LockWait: 5 * time.Second, RefreshTimeout: 3 * time.Second,
		Logger: quietLogger()}
	stacks := []*testworld.Stack{profiledStack(t, w, opts, profiles.Generic), profiledStack(t, w, opts, profiles.Generic), profiledStack(t, w, opts, profiles.Generic)}
	w.Connect(t, stacks[0])
	var asked atomic.Int64
	p.SetRefreshFault(func() sandbox.Fault { asked.Add(1); return sandbox.FaultUnknownCode })
	return w, stacks, clock, &asked
}

func stored(t testing.TB, s *testworld.Stack) domain.Token {
	t.Helper()
	tok, err := s.Repo.Get(context.Background(), conn)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// A refresh whose answer is lost (the sandbox processes it, rotating the
// refresh token and revoking the access token, and closes the connection)
// presents the same refresh token again only where the profile declares a
// reuse grace window (xero: 30 min), and there gets the first answer
// replayed. Where the profile declares none (zoom), the token is never
// presented twice: one request, the connection failing with answer_lost,
// not needs_reauth, and no process asks again. Where nothing is known of
// the provider (generic), the token is presented again once, after a probe
// the provider answers: here the provider had processed the lost request,
// so that is a reuse and the grant is found dead, as it was (its rotated
// token was lost with the answer).
func TestLostAnswerPresentedAgainOnlyWithinTheGraceWindow(t *testing.T) {
	for _, tc := range []struct {
		profile               string
		ok                    bool
		requests, replays     int64
		reuse                 int64
		status                domain.Status
		failingEvents, asking int
	}{
		{profile: "xero", ok: true, requests: 2, replays: 1, status: domain.StatusActive},
		{profile: "zoom", ok: false, requests: 1, status: domain.StatusFailing, failingEvents: 1},
		{profile: profiles.Generic, ok: false, requests: 3, reuse: 1, status: domain.StatusNeedsReauth},
	} {
		t.Run(tc.profile, func(t *testing.T) {
			prof, err := profiles.Get(tc.profile)
			if err != nil {
				t.Fatal(err)
			}
			p, err := sandbox.New(sandbox.Like(prof, sandbox.Options{AccessTokenLifespan: time.Hour}))
			if err != nil {
				t.Fatal(err)
			}
			w := testworld.With(t, p)
			clock := &movingClock{now: time.Now()}
			opts := usecase.Options{Clock: clock, Skew: time.Minute, LockWait: 5 * time.Second, RefreshTimeout: 3 * time.Second,
				Logger: quietLogger()}
			a, b := profiledStack(t, w, opts, tc.profile), profiledStack(t, w, opts, tc.profile)
			first := w.Connect(t, a)
			var asked atomic.Int64
			p.SetRefreshFault(func() sandbox.Fault {
				if asked.Add(1) == 1 {
					return sandbox.FaultLostAnswer
				}
				return sandbox.FaultNone
			})
			clock.set(first.Expiry.Add(time.Second))
			_, err = a.UC.Token(context.Background(), conn)
			if (err == nil) != tc.ok {
				t.Fatalf("Token after a lost answer: %v", err)
			}
			// Another process, ten minutes on, within any window.
			clock.set(first.Expiry.Add(10 * time.Minute))
			_, errB := b.UC.Token(context.Background(), conn)
			st := p.Stats()
			t.Logf("%s: requests %d, lost %d, replays %d, reuse %d; first call: %v; another process later: %v",
				tc.profile, asked.Load(), st.LostAnswers, st.GraceReplays, st.RefreshReuse, err, errB)
			if asked.Load() != tc.requests || st.GraceReplays != tc.replays || st.RefreshReuse != tc.reuse || st.LostAnswers != 1 {
				t.Errorf("requests %d (want %d), grace replays %d (want %d), reuse %d (want %d)",
					asked.Load(), tc.requests, st.GraceReplays, tc.replays, st.RefreshReuse, tc.reuse)
			}
			c, err := a.Repo.Connection(context.Background(), conn)
			if err != nil {
				t.Fatal(err)
			}
			if c.Status != tc.status {
				t.Errorf("status %s (%s), want %s", c.Status, c.StatusReason, tc.status)
			}
			if tc.status == domain.StatusFailing {
				if c.Failure.Code != "answer_lost" || !errors.Is(errB, domain.ErrRefreshFailing) {
					t.Errorf("failure %+v, later call %v: want answer_lost and ErrRefreshFailing", c.Failure, errB)
				}
			}
			if n := outboxCount(t, a, "connection.refresh_failing"); n != tc.failingEvents {
				t.Errorf("connection.refresh_failing events: %d, want %d", n, tc.failingEvents)
			}
		})
	}
}

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
