package provider_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/infra/provider/profiles"
	"github.com/tokenguard/tokenguard/internal/sandbox"
)

// These tests run Retrying over the real Refresher against the strict
// sandbox provider (fosite: the refresh token rotates on every success, and
// presenting a rotated one is counted as reuse).

// hangTimeout is the HTTP client timeout: a hung request fails after it.
const hangTimeout = 200 * time.Millisecond

type rig struct {
	p     *sandbox.Provider
	srv   *httptest.Server
	oauth *oauth2.Config
	first *oauth2.Token
}

func newRig(t *testing.T) *rig {
	t.Helper()
	p, err := sandbox.New(sandbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p.Handler())
	t.Cleanup(srv.Close)
	cfg := p.OAuth2Config(srv.URL)
	tok, err := sandbox.Grant(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &rig{p: p, srv: srv, oauth: cfg, first: tok}
}

func (r *rig) retrying(policy provider.Policy) *provider.Retrying {
	return provider.NewRetrying(provider.NewRefresher(r.oauth, provider.NewHTTPClient(hangTimeout)), policy)
}

// always injects f into every refresh.
func always(f sandbox.Fault) func() sandbox.Fault { return func() sandbox.Fault { return f } }

// logTo returns a logger writing into a buffer that is safe to read later.
func logTo() (*slog.Logger, func() string) {
	var mu sync.Mutex
	var buf bytes.Buffer
	w := writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug})),
		func() string { mu.Lock(); defer mu.Unlock(); return buf.String() }
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func TestRetryingRidesOutTransientFaults(t *testing.T) {
	r := newRig(t)
	// A fixed schedule, so every kind of answered fault is exercised on
	// every run: 8 of 20 requests answer 503, 1 answers 429 (Retry-After:
	// 1). A hang is a lost answer, never retried within the call
	// (TestRetryingReplaysALostAnswerOnlyAsTheGraceWindowAllows).
	u, tm, o := sandbox.FaultUnavailable, sandbox.FaultTooManyRequests, sandbox.FaultNone
	schedule := []sandbox.Fault{
		u, o, u, u, o, u, o, u, o, tm,
		o, u, u, o, o, u, o, o, o, o,
	}
	var faults, refreshes int
	for _, f := range schedule {
		if f == o {
			refreshes++
		} else {
			faults++
		}
	}
	var calls atomic.Int64
	r.p.SetRefreshFault(func() sandbox.Fault {
		i := calls.Add(1) - 1
		if int(i) < len(schedule) {
			return schedule[i]
		}
		return sandbox.FaultNone
	})
	log, logged := logTo()
	ret := r.retrying(provider.Policy{Log: log})

	rt := domain.NewSecret(r.first.RefreshToken)
	var at domain.Secret
	seen := map[string]bool{r.first.RefreshToken: true}
	for i := range refreshes {
		const budget = 4 * time.Second
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		start := time.Now()
		g, err := ret.Refresh(ctx, rt)
		cancel()
		if err != nil {
			t.Fatalf("refresh %d failed: %v", i, err)
		}
		if took := time.Since(start); took > budget {
			t.Fatalf("refresh %d took %v, past its %v deadline", i, took, budget)
		}
		if g.AccessToken.IsZero() || g.RefreshToken.IsZero() || seen[g.RefreshToken.Reveal()] {
			t.Fatalf("refresh %d: empty or repeated token", i)
		}
		seen[g.RefreshToken.Reveal()] = true
		rt, at = g.RefreshToken, g.AccessToken
	}

	st := r.p.Stats()
	if st.Refreshes != int64(refreshes) || st.RefreshReuse != 0 {
		t.Errorf("provider saw %d refreshes and %d reuses, want %d and 0", st.Refreshes, st.RefreshReuse, refreshes)
	}
	if st.RefreshFaults != int64(faults) {
		t.Errorf("provider injected %d faults, want the whole schedule's %d", st.RefreshFaults, faults)
	}
	// The last access token is the live one.
	if code := resource(t, r.srv.URL, at.Reveal()); code != http.StatusOK {
		t.Errorf("latest access token answered %d", code)
	}
	out := logged()
	if n := strings.Count(out, "retrying"); n != int(st.RefreshFaults) {
		t.Errorf("logged %d retries, want %d", n, st.RefreshFaults)
	}
	for s := range seen {
		if strings.Contains(out, s) {
			t.Fatalf("a refresh token reached the log:\n%s", out)
		}
	}
}

func TestRetryingNeverRetriesARejectedGrant(t *testing.T) {
	r := newRig(t)
	r.p.SetRefreshFault(always(sandbox.FaultInvalidGrant))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err := r.retrying(provider.Policy{}).Refresh(ctx, domain.NewSecret(r.first.RefreshToken))
	if !errors.Is(err, domain.ErrGrantRevoked) {
		t.Fatalf("err = %v, want ErrGrantRevoked", err)
	}
	var pe *domain.ProviderError
	if !errors.As(err, &pe) || pe.Code != "invalid_grant" {
		t.Errorf("err = %v, want the provider's invalid_grant", err)
	}
	if st := r.p.Stats(); st.RefreshFaults != 1 || st.RefreshRejected != 1 {
		t.Errorf("provider saw %d requests, want exactly 1", st.RefreshRejected)
	}
}

// Only transient failures are retried: a rejected client, a misconfigured
// endpoint and a dead grant return after the first request.
func TestRetryingRetriesOnlyTransientFailures(t *testing.T) {
	cases := []struct {
		status int
		body   string
		want   error
		tries  int64
	}{
		{401, `{"error":"invalid_client"}`, domain.ErrClientRejected, 1},
		{400, `{"error":"unauthorized_client"}`, domain.ErrClientRejected, 1},
		{404, `not found`, domain.ErrEndpointMisconfigured, 1},
		{302, ``, domain.ErrEndpointMisconfigured, 1},
		{400, `{"error":"invalid_grant"}`, domain.ErrGrantRevoked, 1},
		{200, `{"ok":false,"error":"invalid_refresh_token"}`, domain.ErrGrantRevoked, 1},
		{503, `{"error":"temporarily_unavailable"}`, domain.ErrProviderUnavailable, 3},
		// Unclassified: not retried within the call (the use case paces
		// them per connection), and still not a dead grant.
		{400, `<html>oops</html>`, domain.ErrProviderUnavailable, 1},
		{400, `{"error":"account_under_review"}`, domain.ErrProviderUnavailable, 1},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%d %s", c.status, c.body), func(t *testing.T) {
			var n atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n.Add(1)
				if c.status == 302 {
					w.Header().Set("Location", "/elsewhere")
				}
				w.WriteHeader(c.status)
				_, _ = w.Write([]byte(c.body))
			}))
			defer srv.Close()
			cfg := &oauth2.Config{ClientID: "c", ClientSecret: "s", Endpoint: oauth2.Endpoint{TokenURL: srv.URL, AuthStyle: oauth2.AuthStyleInHeader}}
			r := provider.NewRetrying(provider.NewRefresher(cfg, nil), provider.Policy{InitialInterval: time.Millisecond, MaxAttempts: 3})
			_, err := r.Refresh(context.Background(), domain.NewSecret("rt"))
			if !errors.Is(err, c.want) {
				t.Errorf("err = %v, want %v", err, c.want)
			}
			if got := n.Load(); got != c.tries {
				t.Errorf("%d requests, want %d", got, c.tries)
			}
		})
	}
}

// New attempts start only within RetryWithin, however far the deadline:
// the caller awaits an answer longer than it retries answered failures.
func TestRetryingStartsAttemptsOnlyWithinRetryWithin(t *testing.T) {
	r := newRig(t)
	r.p.SetRefreshFault(always(sandbox.FaultUnavailable))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err := r.retrying(provider.Policy{RetryWithin: 400 * time.Millisecond, Jitter: -1}).Refresh(ctx, domain.NewSecret(r.first.RefreshToken))
	took := time.Since(start)
	if !errors.Is(err, domain.ErrProviderUnavailable) {
		t.Fatalf("err = %v, want ErrProviderUnavailable", err)
	}
	if n := r.p.Stats().RefreshFaults; took > 2*time.Second || n < 2 {
		t.Errorf("returned after %v with %d attempts; want retries within 400ms, then the last answer", took, n)
	}
}

// A retry starts only while AnswerWithin of the deadline is left: its answer
// is awaited that long. Against a refusing provider, retries stop 1.5 s
// before a 2 s deadline; the control, without AnswerWithin, retries until it.
func TestRetryingLeavesEachRetryItsAnswerTime(t *testing.T) {
	for _, answerWithin := range []time.Duration{1500 * time.Millisecond, 0} {
		r := newRig(t)
		r.p.SetRefreshFault(always(sandbox.FaultUnavailable))
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		start := time.Now()
		_, err := r.retrying(provider.Policy{AnswerWithin: answerWithin, Jitter: -1}).Refresh(ctx, domain.NewSecret(r.first.RefreshToken))
		took := time.Since(start)
		cancel()
		if !errors.Is(err, domain.ErrProviderUnavailable) {
			t.Fatalf("AnswerWithin %v: err = %v, want ErrProviderUnavailable", answerWithin, err)
		}
		n := r.p.Stats().RefreshFaults
		if answerWithin > 0 && (took > 2*time.Second-answerWithin || n < 2) {
			t.Errorf("AnswerWithin %v: returned after %v with %d attempts; want retries only in the first 500ms", answerWithin, took, n)
		}
		if answerWithin == 0 && took < time.Second {
			t.Errorf("control: returned after %v with %d attempts; want retries until about the deadline", took, n)
		}
	}
}

func TestRetryingStopsAtTheDeadline(t *testing.T) {
	for _, f := range []sandbox.Fault{sandbox.FaultUnavailable, sandbox.FaultHang} {
		t.Run(f.String(), func(t *testing.T) {
			r := newRig(t)
			r.p.SetRefreshFault(always(f))
			const budget = 900 * time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), budget)
			defer cancel()
			start := time.Now()
			_, err := r.retrying(provider.Policy{}).Refresh(ctx, domain.NewSecret(r.first.RefreshToken))
			took := time.Since(start)
			if !errors.Is(err, domain.ErrProviderUnavailable) {
				t.Fatalf("err = %v, want ErrProviderUnavailable", err)
			}
			if took > budget+100*time.Millisecond {
				t.Errorf("returned after %v for a %v deadline", took, budget)
			}
			// A refused request is retried; a hung one was sent, and its
			// refresh token is not presented again while its answer may
			// still come.
			want := func(n int64) bool { return n >= 2 }
			if f == sandbox.FaultHang {
				want = func(n int64) bool { return n == 1 }
				var pe *domain.ProviderError
				if !errors.As(err, &pe) || !pe.Lost {
					t.Errorf("err = %v, want a lost answer", err)
				}
			}
			if n := r.p.Stats().RefreshFaults; !want(n) {
				t.Errorf("provider saw %d requests", n)
			}
			// Nothing was rotated: the refresh token we kept still works.
			r.p.SetRefreshFault(nil)
			if _, err := r.retrying(provider.Policy{}).Refresh(context.Background(), domain.NewSecret(r.first.RefreshToken)); err != nil {
				t.Errorf("refresh token spent by failed tries: %v", err)
			}
			if st := r.p.Stats(); st.RefreshReuse != 0 {
				t.Errorf("RefreshReuse = %d", st.RefreshReuse)
			}
		})
	}
}

func TestRetryingGivesUpWhenRetryAfterPassesTheDeadline(t *testing.T) {
	r := newRig(t)
	r.p.SetRefreshFault(always(sandbox.FaultTooManyRequests)) // Retry-After: 1
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := r.retrying(provider.Policy{}).Refresh(ctx, domain.NewSecret(r.first.RefreshToken))
	took := time.Since(start)
	var pe *domain.ProviderError
	if !errors.As(err, &pe) || pe.HTTPStatus != http.StatusTooManyRequests || pe.RetryAfter != time.Second {
		t.Fatalf("err = %v, want the provider's 429 with its Retry-After", err)
	}
	if took > 300*time.Millisecond {
		t.Errorf("waited %v although Retry-After could not fit before the deadline", took)
	}
	if n := r.p.Stats().RefreshFaults; n != 1 {
		t.Errorf("provider saw %d requests, want 1", n)
	}
}

func TestRetryingHonoursRetryAfterAsMinimumWait(t *testing.T) {
	r := newRig(t)
	var calls atomic.Int64
	r.p.SetRefreshFault(func() sandbox.Fault {
		if calls.Add(1) == 1 {
			return sandbox.FaultTooManyRequests // Retry-After: 1
		}
		return sandbox.FaultNone
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := r.retrying(provider.Policy{}).Refresh(ctx, domain.NewSecret(r.first.RefreshToken)); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < time.Second {
		t.Errorf("retried after %v, before the provider's Retry-After of 1s", took)
	}
}

func TestRetryingStopsWhenCancelled(t *testing.T) {
	r := newRig(t)
	r.p.SetRefreshFault(always(sandbox.FaultUnavailable))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	time.AfterFunc(150*time.Millisecond, cancel)
	start := time.Now()
	_, err := r.retrying(provider.Policy{InitialInterval: 5 * time.Second, MaxInterval: 5 * time.Second, Jitter: -1}).
		Refresh(ctx, domain.NewSecret(r.first.RefreshToken))
	if !errors.Is(err, context.Canceled) || !errors.Is(err, domain.ErrProviderUnavailable) {
		t.Fatalf("err = %v, want the provider's error and context.Canceled", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("cancelled retry returned after %v", took)
	}
}

func TestRetryingMaxAttemptsAndRefusedConnections(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nothing listens there now: connection refused

	log, logged := logTo()
	cfg := &oauth2.Config{ClientID: "c", ClientSecret: "s", Endpoint: sandbox.Endpoint("http://" + addr)}
	ret := provider.NewRetrying(provider.NewRefresher(cfg, provider.NewHTTPClient(hangTimeout)),
		provider.Policy{InitialInterval: 5 * time.Millisecond, MaxAttempts: 4, PauseAfter: -1, Log: log})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	const secret = "rt-must-not-be-logged"
	_, err = ret.Refresh(ctx, domain.NewSecret(secret))
	if !errors.Is(err, domain.ErrProviderUnavailable) || !strings.Contains(err.Error(), "after 4 attempts") {
		t.Fatalf("err = %v, want ErrProviderUnavailable after 4 attempts", err)
	}
	out := logged()
	if n := strings.Count(out, "retrying"); n != 3 {
		t.Errorf("logged %d retries, want 3:\n%s", n, out)
	}
	if strings.Contains(out, secret) || strings.Contains(err.Error(), secret) {
		t.Errorf("refresh token leaked: %v\n%s", err, out)
	}
}

func resource(t *testing.T, base, accessToken string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+"/resource", nil)
	req.Header.Set("Authorization", "Bearer "+accessToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

// A request whose answer is lost (read, then the connection closed) may be
// sent again only as the profile's reuse grace window allows: unknown,
// not within the call (the use case probes the endpoint first); none,
// never (the error says so); a window, within it from the first
// presentation; a provider that does not rotate, like any transient
// failure. A request that never left (the
// endpoint refused the connection) proves nothing was processed and is
// retried whatever the window.
func TestRetryingReplaysALostAnswerOnlyAsTheGraceWindowAllows(t *testing.T) {
	cases := []struct {
		name     string
		grace    profiles.Duration
		tries    int64
		noReplay bool
		until    bool
		harmless bool
	}{
		{"unknown window", profiles.Duration{}, 1, false, false, false},
		{"no rotation", profiles.Duration{}, 3, false, false, true},
		{"no window", profiles.Duration{Known: true}, 1, true, false, false},
		{"within a window", profiles.Duration{D: time.Hour, Known: true}, 3, false, true, false},
		{"past a window", profiles.Duration{D: time.Nanosecond, Known: true}, 1, false, true, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var n atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n.Add(1)
				_, _ = io.ReadAll(r.Body)
				panic(http.ErrAbortHandler) // processed, never answered
			}))
			defer srv.Close()
			cfg := &oauth2.Config{ClientID: "c", ClientSecret: "s", Endpoint: oauth2.Endpoint{TokenURL: srv.URL, AuthStyle: oauth2.AuthStyleInHeader}}
			r := provider.NewRetrying(provider.NewRefresher(cfg, nil),
				provider.Policy{InitialInterval: time.Millisecond, MaxAttempts: 3, PauseAfter: -1, ReuseGrace: c.grace, ReplayHarmless: c.harmless})
			_, err := r.Refresh(context.Background(), domain.NewSecret("rt"))
			var pe *domain.ProviderError
			if !errors.As(err, &pe) || !pe.Lost || !errors.Is(err, domain.ErrProviderUnavailable) {
				t.Fatalf("err = %v, want a lost answer", err)
			}
			if got := n.Load(); got != c.tries {
				t.Errorf("%d requests, want %d", got, c.tries)
			}
			if pe.NoReplay != c.noReplay || pe.ReplayUntil.IsZero() == c.until {
				t.Errorf("NoReplay %v, ReplayUntil %v", pe.NoReplay, pe.ReplayUntil)
			}
		})
	}
	t.Run("never sent", func(t *testing.T) {
		srv := httptest.NewServer(http.NotFoundHandler())
		srv.Close() // refused: nothing reached the provider
		cfg := &oauth2.Config{ClientID: "c", ClientSecret: "s", Endpoint: oauth2.Endpoint{TokenURL: srv.URL, AuthStyle: oauth2.AuthStyleInHeader}}
		var tries atomic.Int64
		r := provider.NewRetrying(countingRefresher{provider.NewRefresher(cfg, nil), &tries},
			provider.Policy{InitialInterval: time.Millisecond, MaxAttempts: 3, PauseAfter: -1, ReuseGrace: profiles.Duration{Known: true}})
		_, err := r.Refresh(context.Background(), domain.NewSecret("rt"))
		var pe *domain.ProviderError
		if !errors.As(err, &pe) || pe.Lost || pe.NoReplay {
			t.Fatalf("err = %v (%+v), want a failure that never left", err, pe)
		}
		if tries.Load() != 3 {
			t.Errorf("%d tries, want 3", tries.Load())
		}
	})
}

type countingRefresher struct {
	next  provider.GrantRefresher
	tries *atomic.Int64
}

func (c countingRefresher) Refresh(ctx context.Context, rt domain.Secret) (domain.Grant, error) {
	c.tries.Add(1)
	return c.next.Refresh(ctx, rt)
}
