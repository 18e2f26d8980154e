package usecase_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/testworld"
	"github.com/tokenguard/tokenguard/usecase"
)

// clientWindow makes the sandbox answer every refresh 401 invalid_client
// while open, as during a client-secret rotation, and counts those answers.
type clientWindow struct {
	open     atomic.Bool
	rejected atomic.Int64
}

func (c *clientWindow) fault() sandbox.Fault {
	if !c.open.Load() {
		return sandbox.FaultNone
	}
	c.rejected.Add(1)
	return sandbox.FaultInvalidClient
}

// rows is the tokenguard_tokens table as stored, byte for byte (as text).
func rows(t *testing.T, s *testworld.Stack) []string {
	t.Helper()
	var out []string
	if err := s.DB.Raw(`SELECT concat_ws('|', connection_id, access_token, token_type, refresh_token, expiry, obtained_at,
		version, status, status_reason, updated_at) FROM tokenguard_tokens ORDER BY connection_id`).Scan(&out).Error; err != nil {
		t.Fatal(err)
	}
	return out
}

// callResult is one Token call (and, when it succeeded, one API call with
// the token).
type callResult struct {
	at     time.Time
	stack  int
	name   string
	err    error
	status int
	expiry time.Time // of the token served
}

// caller asks every stack for every connection's token every 20 ms and
// uses it, recording each result.
type caller struct {
	mu   sync.Mutex
	got  []callResult
	stop chan struct{}
	wg   sync.WaitGroup
}

func startCallers(t *testing.T, w *testworld.World, stacks []*testworld.Stack, names []string) *caller {
	c := &caller{stop: make(chan struct{})}
	for i, s := range stacks {
		for _, n := range names {
			c.wg.Go(func() {
				for {
					select {
					case <-c.stop:
						return
					case <-time.After(20 * time.Millisecond):
					}
					r := callResult{stack: i, name: n}
					tok, err := s.UC.Token(context.Background(), n)
					r.err, r.expiry = err, tok.Expiry
					if err == nil {
						r.status = w.CallResource(t, tok.AccessToken.Reveal())
					}
					r.at = time.Now()
					c.mu.Lock()
					c.got = append(c.got, r)
					c.mu.Unlock()
				}
			})
		}
	}
	return c
}

func (c *caller) finish() []callResult {
	close(c.stop)
	c.wg.Wait()
	return c.got
}

// An invalid_client window of 5 s (a client-secret rotation at the
// provider) against two processes sharing five connections: no connection
// changes in any way, calls are served while the stored token is valid and
// fail with ErrClientRejected only after it expired, the provider is called
// a few times per process (not once per caller and call), one ERROR line per
// connection and process, and every caller recovers by itself within a few
// seconds after the window.
func TestInvalidClientWindowLeavesConnectionsActive(t *testing.T) {
	const (
		lifespan = 2 * time.Second
		skew     = time.Second
		window   = 5 * time.Second
		conns    = 5
	)
	w := testworld.New(t, lifespan)
	var win clientWindow
	w.Provider.SetRefreshFault(win.fault)
	logs := []*syncBuffer{{}, {}}
	stacks := make([]*testworld.Stack, len(logs))
	for i, l := range logs {
		stacks[i] = w.Stack(t, usecase.Options{Skew: skew, Logger: slog.New(slog.NewTextHandler(l, nil))})
	}
	names := w.ConnectMany(t, stacks[0], conns)
	c := startCallers(t, w, stacks, names)
	time.Sleep(lifespan) // a refresh cycle before the window

	o := openClientWindow(t, &win, stacks[0], names, window)
	took := awaitRecovery(c, o.closed, len(stacks)*conns)
	in := tallyWindow(c.finish(), o)
	errorLines := 0
	for _, l := range logs {
		errorLines += strings.Count(l.String(), "level=ERROR")
	}
	st := w.Provider.Stats()
	t.Logf("window %v: %d calls served (%d more answered 401 in the token's last 250 ms), %d failed with ErrClientRejected (%d while the token was valid); provider answered invalid_client %d times; %d ERROR lines",
		window, in.served, in.lastMoment, in.failed, in.early, o.rejected, errorLines)
	t.Logf("recovery after the window, per process and connection: min %v, median %v, max %v (%d of %d)",
		took[0].Round(time.Millisecond), took[len(took)/2].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond), len(took), len(stacks)*conns)

	if !slices.Equal(o.before, o.after) {
		t.Errorf("stored tokens changed during the window:\nbefore %q\nafter  %q", o.before, o.after)
	}
	if len(in.wrong) > 0 {
		t.Errorf("%d unexpected results, e.g. %q", len(in.wrong), in.wrong[0])
	}
	if in.served == 0 || in.failed == 0 || in.early > 0 {
		t.Errorf("served %d, failed %d (%d early): want valid tokens served and expired ones refused", in.served, in.failed, in.early)
	}
	// Without the pause every caller would reach the provider every 20 ms
	// (about 2500 calls in the window); with it each process calls a few
	// times, once per connection at most each time the pause ends.
	if limit := int64(len(stacks) * conns * 8); o.rejected > limit || o.rejected == 0 {
		t.Errorf("provider answered invalid_client %d times in the window, want 1..%d", o.rejected, limit)
	}
	if errorLines == 0 || errorLines > len(stacks)*conns {
		t.Errorf("%d ERROR lines, want at most one per connection and process", errorLines)
	}
	if len(took) != len(stacks)*conns || took[len(took)-1] > 15*time.Second {
		t.Errorf("recovered %d of %d callers, slowest after %v", len(took), len(stacks)*conns, took[len(took)-1])
	}
	for _, n := range names {
		if tok := mustGetName(t, stacks[0], n); tok.Status != domain.StatusActive {
			t.Errorf("%s: %s (%s)", n, tok.Status, tok.StatusReason)
		}
	}
	if st.RefreshReuse != 0 {
		t.Errorf("refresh-token reuse = %d", st.RefreshReuse)
	}
}

// openedWindow is what the invalid_client window left: when it was open,
// the stored rows at its start and end, each connection's stored expiry
// as it began, and the provider's invalid_client answers meanwhile.
type openedWindow struct {
	opened, closed time.Time
	before, after  []string
	expiry         map[string]time.Time
	rejected       int64
}

// openClientWindow opens win for window, reading s's stored tokens just
// after it opened and just before it closes.
func openClientWindow(t *testing.T, win *clientWindow, s *testworld.Stack, names []string, window time.Duration) openedWindow {
	t.Helper()
	win.open.Store(true)
	o := openedWindow{opened: time.Now(), expiry: map[string]time.Time{}}
	time.Sleep(100 * time.Millisecond) // refreshes already past the check finish
	o.before = rows(t, s)
	for _, n := range names {
		tok, err := s.Repo.Get(context.Background(), n)
		if err != nil {
			t.Fatal(err)
		}
		o.expiry[n] = tok.Expiry
	}
	time.Sleep(window - 100*time.Millisecond)
	o.after = rows(t, s)
	win.open.Store(false)
	o.closed = time.Now()
	o.rejected = win.rejected.Load()
	return o
}

// awaitRecovery waits, up to 20 s after closed, for every one of the
// callers (per process and connection) to make a successful call after
// closed, and returns how long after closed each one first did, sorted.
func awaitRecovery(c *caller, closed time.Time, callers int) []time.Duration {
	recovered := map[string]time.Duration{}
	deadline := closed.Add(20 * time.Second)
	for len(recovered) < callers && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		c.mu.Lock()
		for _, r := range c.got {
			key := fmt.Sprint(r.stack, r.name)
			if _, ok := recovered[key]; !ok && r.at.After(closed) && r.err == nil && r.status == http.StatusOK {
				recovered[key] = r.at.Sub(closed)
			}
		}
		c.mu.Unlock()
	}
	var took []time.Duration
	for _, d := range recovered {
		took = append(took, d)
	}
	slices.Sort(took)
	return took
}

// windowTally sorts the calls made during the window.
type windowTally struct {
	served     int      // answered 200
	lastMoment int      // served, then answered 401 in the token's last moment
	failed     int      // ErrClientRejected
	early      int      // of those, while the stored token was still valid
	wrong      []string // anything else
}

func tallyWindow(results []callResult, o openedWindow) windowTally {
	var in windowTally
	for _, r := range results {
		if r.at.Before(o.opened.Add(100*time.Millisecond)) || r.at.After(o.closed) {
			continue
		}
		switch {
		case r.err == nil && r.status == http.StatusOK:
			in.served++
		case r.err == nil && r.status == http.StatusUnauthorized && r.at.After(r.expiry.Add(-250*time.Millisecond)):
			// Served in its last moment: the provider's clock had
			// expired it (expires_in is rounded to seconds).
			in.lastMoment++
		case r.err == nil:
			in.wrong = append(in.wrong, fmt.Sprintf("%s: API answered %d", r.name, r.status))
		case !errors.Is(r.err, domain.ErrClientRejected) || errors.Is(r.err, domain.ErrNeedsReauth):
			in.wrong = append(in.wrong, r.err.Error())
		default:
			in.failed++
			if r.at.Before(o.expiry[r.name].Add(-50 * time.Millisecond)) {
				in.early++ // failed although the stored token was still valid
			}
		}
	}
	return in
}

// grantDeadOnClientRejection is the broken strategy: it takes the
// provider's rejection of the client for a dead grant.
type grantDeadOnClientRejection struct{ provider.GrantRefresher }

func (r grantDeadOnClientRejection) Refresh(ctx context.Context, rt domain.Secret) (domain.Grant, error) {
	g, err := r.GrantRefresher.Refresh(ctx, rt)
	var pe *domain.ProviderError
	if errors.As(err, &pe) && pe.Class == domain.ClientRejected {
		return g, &domain.ProviderError{Code: pe.Code, HTTPStatus: pe.HTTPStatus, Class: domain.GrantDead}
	}
	return g, err
}

// Control: the same window against the same provider, with the strategy
// that treats invalid_client as a dead grant: the connection is marked
// needs_reauth and stays dead after the window, until a person connects it
// again.
func TestControlInvalidClientAsGrantDeadKillsTheConnection(t *testing.T) {
	w := testworld.New(t, time.Second)
	var win clientWindow
	w.Provider.SetRefreshFault(win.fault)
	clock := &testworld.Clock{}
	s := w.StackWith(t, grantDeadOnClientRejection{provider.NewRefresher(w.OAuth, provider.NewHTTPClient(5*time.Second))},
		usecase.Options{Skew: 500 * time.Millisecond, Clock: clock})
	tok := w.Connect(t, s)
	clock.MoveTo(tok.Expiry.Add(-tok.EffectiveSkew(500*time.Millisecond) + 5*time.Millisecond)) // due
	win.open.Store(true)
	_, err := s.UC.Token(context.Background(), conn)
	clock.Advance(2 * time.Second) // the window lasts
	win.open.Store(false)
	_, after := s.UC.Token(context.Background(), conn)
	stored := s.MustGet(t)
	t.Logf("in the window: %v; after it: %v; stored %s (%s)", err, after, stored.Status, stored.StatusReason)
	if stored.Status != domain.StatusNeedsReauth || !errors.Is(after, domain.ErrNeedsReauth) {
		t.Errorf("broken strategy left the connection %s after the window (%v): the control shows nothing", stored.Status, after)
	}
}

func mustGetName(t *testing.T, s *testworld.Stack, name string) domain.Token {
	t.Helper()
	tok, err := s.Repo.Get(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}
