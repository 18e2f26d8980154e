package usecase_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/infra/provider/profiles"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/testworld"
	"github.com/tokenguard/tokenguard/internal/waitfor"
	"github.com/tokenguard/tokenguard/usecase"
)

// A strict provider (rotation, reuse revokes the grant) that takes longer
// than the refresh timeout to answer keeps the one request it was sent:
// three processes calling at once each get their answer within about the
// refresh timeout (the token is expired: ErrProviderUnavailable), none
// presents the refresh token again while the answer is awaited, the late
// answer is stored, and the grant lives on. The control gives up on the
// answer at the refresh timeout (an answer deadline no longer than it, as
// before the deadline existed): the provider's answer is lost, the next
// presentation is a reuse, and the grant dies.
func TestHungProviderAnswerIsAwaitedNotPresentedTwice(t *testing.T) {
	const (
		refreshTimeout = time.Second
		hang           = 3 * time.Second
	)
	for _, tc := range []struct {
		name     string
		deadline time.Duration
		reuse    bool
	}{
		{"awaited until the answer deadline", 20 * time.Second, false},
		{"control: given up at the refresh timeout", refreshTimeout, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, w, clock, opts := hangWorld(t, refreshTimeout, tc.deadline)
			stacks := []*testworld.Stack{profiledStack(t, w, opts, profiles.Generic), profiledStack(t, w, opts, profiles.Generic), profiledStack(t, w, opts, profiles.Generic)}
			first := w.Connect(t, stacks[0])
			p.SetRefreshLatency(hang)
			clock.set(first.Expiry.Add(time.Second)) // expired: nothing valid to serve

			var wg sync.WaitGroup
			var mu sync.Mutex
			var slowest time.Duration
			for _, s := range stacks {
				for range 4 {
					wg.Go(func() {
						start := time.Now()
						_, err := s.UC.Token(context.Background(), conn)
						took := time.Since(start)
						mu.Lock()
						defer mu.Unlock()
						slowest = max(slowest, took)
						if !errors.Is(err, domain.ErrProviderUnavailable) || errors.Is(err, domain.ErrNeedsReauth) {
							t.Errorf("Token during the hang: %v, want ErrProviderUnavailable", err)
						}
					})
				}
			}
			wg.Wait()
			if !tc.reuse && slowest > refreshTimeout+time.Second {
				t.Errorf("a caller waited %v during the hang, past the refresh timeout %v", slowest, refreshTimeout)
			}
			// The provider answers (or, in the control, answers a client that
			// has gone); then it is healthy again.
			waitfor.Until(t, 5*time.Second, "the hung refresh was never processed", func() bool { return p.Stats().Refreshes == 1 })
			p.SetRefreshLatency(0)
			if !tc.reuse {
				waitfor.Until(t, 5*time.Second, "the late answer was not stored", func() bool {
					got, err := stacks[1].Repo.Get(context.Background(), conn)
					return err == nil && got.Version == first.Version+1
				})
			}
			connection := func() domain.Connection {
				c, err := stacks[0].Repo.Connection(context.Background(), conn)
				if err != nil {
					t.Fatal(err)
				}
				return c
			}
			// Later, past any pause, another process asks again. In the
			// control it presents the refresh token again once the provider
			// answers a probe: a probe sent during the hang holds the next
			// one behind it for the hang's length, so it asks until then.
			later := first.Expiry
			var errLater error
			ask := func() {
				later = later.Add(time.Hour)
				clock.set(later)
				_, errLater = stacks[2].UC.Token(context.Background(), conn)
			}
			ask()
			if tc.reuse {
				waitfor.Until(t, 20*time.Second, "control: the grant was not killed by a second presentation", func() bool {
					if p.Stats().RefreshReuse > 0 && connection().Status == domain.StatusNeedsReauth {
						return true
					}
					ask()
					return false
				})
			}
			st, c := p.Stats(), connection()
			t.Logf("slowest caller %v; provider: %d refreshes, %d rejected, %d reuse; later call: %v; status %s %s",
				slowest.Round(time.Millisecond), st.Refreshes, st.RefreshRejected, st.RefreshReuse, errLater, c.Status, c.StatusReason)
			if tc.reuse {
				return
			}
			if st.RefreshReuse != 0 || c.Status != domain.StatusActive || errLater != nil {
				t.Errorf("reuse %d, status %s, later call %v: want 0, active, a token", st.RefreshReuse, c.Status, errLater)
			}
		})
	}
}

// A 401 says the provider has rotated the token already: a forced refresh
// that finds the refresh that did so still awaiting its answer, past the
// refresh timeout, waits for that answer (within the lock wait) and
// returns the token it brings, rather than fail while the late answer is
// on its way. The provider sees one refresh and no reuse.
func TestForcedRefreshWaitsForTheAnswerUnderWay(t *testing.T) {
	const (
		refreshTimeout = time.Second
		hang           = 3 * time.Second
	)
	p, w, clock, opts := hangWorld(t, refreshTimeout, 20*time.Second)
	a, b := profiledStack(t, w, opts, profiles.Generic), profiledStack(t, w, opts, profiles.Generic)
	first := w.Connect(t, a)
	p.SetRefreshLatency(hang)
	clock.set(first.Expiry.Add(-30 * time.Second)) // due, still valid

	// a's refresh outlasts the refresh timeout: a's caller is served the
	// still-valid token while the answer is awaited.
	got, err := a.UC.Token(context.Background(), conn)
	if err != nil || got.Version != first.Version {
		t.Fatalf("Token during the hang: version %d, %v; want the valid version %d", got.Version, err, first.Version)
	}
	// The provider rotated: b's call with that token was answered 401.
	start := time.Now()
	forced, err := b.UC.ForceRefresh(context.Background(), conn, first.Version)
	took := time.Since(start)
	st := p.Stats()
	t.Logf("forced refresh after %v: version %d, %v; provider: %d refreshes, %d reuse", took.Round(time.Millisecond), forced.Version, err, st.Refreshes, st.RefreshReuse)
	if err != nil || forced.Version != first.Version+1 {
		t.Fatalf("forced refresh during the awaited answer: version %d, %v; want version %d", forced.Version, err, first.Version+1)
	}
	if st.Refreshes != 1 || st.RefreshReuse != 0 {
		t.Errorf("provider saw %d refreshes and %d reuse, want 1 and 0", st.Refreshes, st.RefreshReuse)
	}
}

// A lease whose holder vanished with its request unanswered is abandoned,
// never free: nobody presents the refresh token while it runs; then the
// next process records the lost answer (answer_lost) and presents the
// token again only once the provider answers a probe. While the provider
// does not answer the probe the connection is shown failing and the probe
// is paced.
func TestAbandonedLeaseIsAnswerLostNotFree(t *testing.T) {
	p, err := sandbox.New(sandbox.Options{AccessTokenLifespan: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	w := testworld.With(t, p)
	clock := &movingClock{now: time.Now()}
	opts := usecase.Options{Clock: clock, Skew: time.Minute, LockWait: 3 * time.Second, RefreshTimeout: time.Second,
		AnswerDeadline: 2 * time.Second, Logger: quietLogger()}
	a := profiledStack(t, w, opts, profiles.Generic)
	first := w.Connect(t, a)
	ctx := context.Background()

	// A holder takes the lease, for an answer deadline of 2 s, and dies: it
	// stops renewing it, and nothing ends it.
	held, err := a.Repo.Claim(ctx, first, opts.AnswerDeadline)
	if err != nil || held.End == nil {
		t.Fatalf("claim: %v (taken: %t)", err, held.End != nil)
	}
	held.End(false)
	clock.set(first.Expiry.Add(time.Second))
	b := profiledStack(t, w, opts, profiles.Generic)
	if _, err := b.UC.Token(ctx, conn); !errors.Is(err, domain.ErrProviderUnavailable) {
		t.Fatalf("Token while the dead holder's lease runs: %v, want ErrProviderUnavailable", err)
	}
	waitfor.Until(t, 5*time.Second,

		"the dead holder's lease never ran out", func() bool {
			_, l, err := a.Repo.Read(ctx, conn)
			return err == nil && l.Abandoned
		})

	if st := p.Stats(); st.Refreshes+st.RefreshRejected != 0 {
		t.Fatalf("the provider was asked %d times while the dead holder's lease ran", st.Refreshes+st.RefreshRejected)
	}

	// The provider does not answer the probe: the token is not presented,
	// the connection is failing with answer_lost, and the probe is paced.
	p.SetRefreshFault(func() sandbox.Fault { return sandbox.FaultUnavailable })
	if _, err := b.UC.Token(ctx, conn); !errors.Is(err, domain.ErrProviderUnavailable) {
		t.Fatalf("Token with the probe unanswered: %v, want ErrProviderUnavailable", err)
	}
	c, err := b.Repo.Connection(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	if c.Status != domain.StatusFailing || c.Failure.Code != domain.CodeAnswerLost || !c.Failure.ProbeFirst() || !c.Failure.RetryAt.After(clock.Now()) {
		t.Fatalf("after a failed probe: status %s, failure %+v; want failing, answer_lost, the next probe later", c.Status, c.Failure)
	}
	if st := p.Stats(); st.Refreshes != 0 || st.RefreshFaults == 0 {
		t.Fatalf("provider: %d refreshes, %d faults: want only probes", st.Refreshes, st.RefreshFaults)
	}

	// Past the pause, with the provider answering: a probe (a made-up
	// refresh token, rejected), then the one presentation.
	p.SetRefreshFault(nil)
	rejected := p.Stats().RefreshRejected
	clock.set(first.Expiry.Add(10 * time.Minute))
	tok, err := b.UC.Token(ctx, conn)
	if err != nil {
		t.Fatalf("Token after the pause: %v", err)
	}
	st := p.Stats()
	if st.Refreshes != 1 || st.RefreshRejected != rejected+1 || st.RefreshReuse != 0 || tok.Version != first.Version+1 {
		t.Errorf("provider: %d refreshes, %d more rejected (the probe), %d reuse; version %d: want 1, 1, 0, %d",
			st.Refreshes, st.RefreshRejected-rejected, st.RefreshReuse, tok.Version, first.Version+1)
	}
	if c, err := b.Repo.Connection(ctx, conn); err != nil || c.Status != domain.StatusActive {
		t.Errorf("status after the refresh: %+v, %v", c, err)
	}
}

// A refresh retried after a 429 presents the refresh token again, and the
// answer to that request is awaited for the whole answer deadline, not what
// is left of it after the first request and the Retry-After. The provider
// answers the first request 429, then takes 3.5 s (past the 4 s deadline
// less the 1 s spent, within the deadline): the answer is stored, a later
// refresh finds the token fresh, no reuse. The control bounds the whole call
// by the answer deadline, as before: the retry's answer is cut off, the
// provider rotates anyway, and the next presentation kills the grant.
func TestRetriedRequestAnswerIsAwaitedTheWholeDeadline(t *testing.T) {
	const (
		refreshTimeout = 2 * time.Second
		deadline       = 4 * time.Second
		latency        = 3500 * time.Millisecond
	)
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "each request awaited for the deadline", true: "control: one deadline for the call"}[control], func(t *testing.T) {
			p, w, clock, opts := hangWorld(t, refreshTimeout, deadline)
			prof, _ := profiles.Get(profiles.Generic)
			pol := retryPolicyFor(prof, opts)
			var ref provider.GrantRefresher = provider.NewRetrying(provider.NewRefresher(w.OAuth, provider.NewHTTPClient(deadline),
				provider.WithProfile(prof), provider.WithClock(opts.Clock.Now)), pol)
			if control {
				pol.AnswerWithin = 0
				ref = callDeadline{provider.NewRetrying(provider.NewRefresher(w.OAuth, provider.NewHTTPClient(deadline),
					provider.WithProfile(prof), provider.WithClock(opts.Clock.Now)), pol), deadline}
			}
			a, b := w.StackWith(t, ref, opts), profiledStack(t, w, opts, profiles.Generic)
			first := w.Connect(t, a)
			var faulted atomic.Bool
			p.SetRefreshFault(func() sandbox.Fault {
				if faulted.CompareAndSwap(false, true) {
					return sandbox.FaultTooManyRequests // Retry-After: 1
				}
				return sandbox.FaultNone
			})
			p.SetRefreshLatency(latency)
			clock.set(first.Expiry.Add(time.Second))
			if _, err := a.UC.Token(context.Background(), conn); !errors.Is(err, domain.ErrProviderUnavailable) {
				t.Fatalf("Token while the retry is out: %v, want ErrProviderUnavailable", err)
			}
			waitfor.Until(t, 10*time.Second, "the retried refresh was never processed", func() bool { return p.Stats().Refreshes == 1 })
			p.SetRefreshLatency(0)
			if !control {
				waitfor.Until(t, 5*time.Second, "the retry's answer was not stored", func() bool {
					got, err := b.Repo.Get(context.Background(), conn)
					return err == nil && got.Version == first.Version+1
				})
			}
			later := first.Expiry
			var errLater error
			ask := func() {
				later = later.Add(time.Hour)
				clock.set(later)
				_, errLater = b.UC.Token(context.Background(), conn)
			}
			ask()
			c := func() domain.Connection {
				c, err := b.Repo.Connection(context.Background(), conn)
				if err != nil {
					t.Fatal(err)
				}
				return c
			}
			if control {
				waitfor.Until(t, 20*time.Second, "control: the grant was not killed by a second presentation", func() bool {
					if p.Stats().RefreshReuse > 0 && c().Status == domain.StatusNeedsReauth {
						return true
					}
					ask()
					return false
				})
				return
			}
			st := p.Stats()
			if st.RefreshFaults != 1 || st.RefreshReuse != 0 || c().Status != domain.StatusActive || errLater != nil {
				t.Errorf("provider: %d faults, %d reuse; status %s; later call %v: want 1, 0, active, a token",
					st.RefreshFaults, st.RefreshReuse, c().Status, errLater)
			}
		})
	}
}

// callDeadline bounds a whole refresh call, retries included, by d: the
// strategy before each request's answer had the answer deadline of its own.
type callDeadline struct {
	next provider.GrantRefresher
	d    time.Duration
}

func (c callDeadline) Refresh(ctx context.Context, refreshToken domain.Secret) (domain.Grant, error) {
	ctx, cancel := context.WithTimeout(ctx, c.d)
	defer cancel()
	return c.next.Refresh(ctx, refreshToken)
}

// retryPolicyFor is the retry policy the apps build for prof: answered
// failures retried within the refresh timeout, each request's answer
// awaited for the answer deadline.
func retryPolicyFor(prof profiles.Profile, opts usecase.Options) provider.Policy {
	pol := provider.PolicyFor(prof, nil)
	pol.RetryWithin, pol.AnswerWithin = opts.RefreshTimeout, opts.AnswerDeadline
	return pol
}

// hangWorld is a strict sandbox provider issuing hour-long tokens, a clock
// the test moves, and options with the given refresh timeout and answer
// deadline (a minute's skew, a 5 s lock wait), for tests of a provider
// that hangs.
func hangWorld(t *testing.T, refreshTimeout, answerDeadline time.Duration) (*sandbox.Provider, *testworld.World, *movingClock, usecase.Options) {
	t.Helper()
	p, err := sandbox.New(sandbox.Options{AccessTokenLifespan: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	clock := &movingClock{now: time.Now()}
	return p, testworld.With(t, p), clock, usecase.Options{Clock: clock, Skew: time.Minute, LockWait: 5 * time.Second,
		RefreshTimeout: refreshTimeout, AnswerDeadline: answerDeadline, Logger: quietLogger()}
}
