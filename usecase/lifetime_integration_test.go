package usecase_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/apiclient"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/testworld"
	"github.com/tokenguard/tokenguard/usecase"
)

// callLoop calls the protected API through apiclient (which recovers a 401
// with ForceRefresh) from every stack until stop, and tallies the answers.
type callLoop struct {
	ok, failed atomic.Int64
	mu         sync.Mutex
	errs       map[string]int
	wg         sync.WaitGroup
	stop       chan struct{}
}

func startCalls(t *testing.T, w *testworld.World, stacks []*testworld.Stack, perStack int, pause time.Duration) *callLoop {
	t.Helper()
	l := &callLoop{errs: map[string]int{}, stop: make(chan struct{})}
	for i, s := range stacks {
		c, err := apiclient.New(w.Server.URL, tokenClients{s.UC}, apiclient.Options{UserAgent: fmt.Sprintf("tokenguard-test-%d/1", i)})
		if err != nil {
			t.Fatal(err)
		}
		for range perStack {
			l.wg.Go(func() {
				for {
					select {
					case <-l.stop:
						return
					default:
					}
					resp, err := c.Get(context.Background(), conn, "/resource")
					switch {
					case err != nil:
						l.fail(err.Error())
					case resp.StatusCode != http.StatusOK:
						l.fail(fmt.Sprint("status ", resp.StatusCode))
					default:
						l.ok.Add(1)
					}
					time.Sleep(pause)
				}
			})
		}
	}
	return l
}

func (l *callLoop) fail(msg string) {
	l.failed.Add(1)
	l.mu.Lock()
	l.errs[msg]++
	l.mu.Unlock()
}

func (l *callLoop) finish() {
	close(l.stop)
	l.wg.Wait()
}

// Tokens that live about 3 s, shorter than the default forced-refresh
// interval (5 s). The provider rounds expires_in to whole seconds (2.6 s
// are announced as 3), and the apps use a token up to 100 ms before its
// announced expiry: calls made in the last 0.3 s of each lifetime are
// answered 401 and recovered by a forced refresh, one per lifetime. Three
// processes call the API for several lifetimes; no call fails.
func TestShortLivedTokensWithDefaultForceInterval(t *testing.T) {
	const lifespan, duration = 2600 * time.Millisecond, 12 * time.Second
	w := testworld.New(t, lifespan)
	opts := usecase.Options{Skew: 100 * time.Millisecond}
	stacks := []*testworld.Stack{w.Stack(t, opts), w.Stack(t, opts), w.Stack(t, opts)}
	w.Connect(t, stacks[0])
	l := startCalls(t, w, stacks, 3, 5*time.Millisecond)
	time.Sleep(duration)
	l.finish()
	st := w.Provider.Stats()
	t.Logf("%d calls ok, %d failed %v; provider: %d refreshes, %d reuse, %d×401",
		l.ok.Load(), l.failed.Load(), l.errs, st.Refreshes, st.RefreshReuse, st.Resource401)
	if l.failed.Load() != 0 {
		t.Errorf("%d calls failed: %v", l.failed.Load(), l.errs)
	}
	if st.RefreshReuse != 0 {
		t.Errorf("refresh-token reuse = %d", st.RefreshReuse)
	}
	if min := int64(duration/lifespan) - 1; st.Refreshes < min {
		t.Errorf("%d refreshes in %v of %v tokens, want at least %d", st.Refreshes, duration, lifespan, min)
	}
}

// A provider that never says when a token expires: the token is used
// until the API answers 401, and then one forced refresh (conditional on
// the failed version) recovers every caller.
func TestTokenWithoutExpiryRecoversFrom401ByOneForcedRefresh(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	const lifespan = time.Second
	p, err := sandbox.New(sandbox.Options{AccessTokenLifespan: lifespan, OmitExpiresIn: true})
	if err != nil {
		t.Fatal(err)
	}
	w := testworld.With(t, p)
	stacks := []*testworld.Stack{w.Stack(t, usecase.Options{}), w.Stack(t, usecase.Options{})}
	first := w.Connect(t, stacks[0])
	if !first.Expiry.IsZero() {
		t.Fatalf("stored expiry %v, want none", first.Expiry)
	}
	ctx := context.Background()
	for _, s := range stacks {
		if tok, err := s.UC.Token(ctx, conn); err != nil || tok.Version != first.Version {
			t.Fatalf("token before the 401: v%d, %v", tok.Version, err)
		}
	}
	if st := w.Provider.Stats(); st.Refreshes != 0 {
		t.Fatalf("%d refreshes of a token without expiry before any 401", st.Refreshes)
	}
	time.Sleep(lifespan + 200*time.Millisecond) // expired at the provider; we cannot know

	l := startCalls(t, w, stacks, 4, 0)
	deadline := time.Now().Add(5 * time.Second)
	for l.ok.Load() < 50 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	l.finish()
	st := w.Provider.Stats()
	stored := stacks[0].MustGet(t)
	t.Logf("%d calls ok, %d failed %v; provider: %d refreshes, %d×401; stored v%d", l.ok.Load(), l.failed.Load(), l.errs,
		st.Refreshes, st.Resource401, stored.Version)
	if l.failed.Load() != 0 || l.ok.Load() < 50 {
		t.Errorf("%d ok, %d failed: %v", l.ok.Load(), l.failed.Load(), l.errs)
	}
	if st.Refreshes != 1 || stored.Version != first.Version+1 || stored.Status != domain.StatusActive || !stored.Expiry.IsZero() {
		t.Errorf("provider saw %d refreshes, stored v%d %s expiry %v; want one forced refresh", st.Refreshes, stored.Version, stored.Status, stored.Expiry)
	}
	if st.RefreshReuse != 0 {
		t.Errorf("refresh-token reuse = %d", st.RefreshReuse)
	}
}
