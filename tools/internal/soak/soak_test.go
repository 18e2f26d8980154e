package soak

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/internal/sandbox"
)

func TestGateKillsOnlyOutsideTheRotationWindow(t *testing.T) {
	g := &gate{inFlight: map[string]int{}, lastDone: map[string]time.Time{}, rescues: map[string]int{}}
	release := make(chan struct{})
	arrived := make(chan struct{})
	srv := httptest.NewServer(g.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-release
	})))
	defer srv.Close()
	go func() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/oauth2/token", nil)
		req.Header.Set("User-Agent", "tokenguard-worker/1.0")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	<-arrived
	ctx := context.Background()
	killed := false
	if g.killOutsideWindow(ctx, "worker", 100*time.Millisecond, func() { killed = true }) || killed {
		t.Fatal("killed while its token request was at the provider")
	}
	if !g.killOutsideWindow(ctx, "server", 0, func() {}) {
		t.Fatal("another app, with nothing in flight, was not killed")
	}
	close(release)
	// Answered: still inside the window until the commit had time (settle).
	time.Sleep(50 * time.Millisecond)
	if g.killOutsideWindow(ctx, "worker", 0, func() { killed = true }) {
		t.Fatal("killed right after the provider answered")
	}
	g.rescuing("worker", +1) // its log said the rotated token is not stored yet
	time.Sleep(settle)
	if g.killOutsideWindow(ctx, "worker", 0, func() { killed = true }) {
		t.Fatal("killed while it held a rotated token not yet stored")
	}
	g.rescuing("worker", -1)
	if !g.killOutsideWindow(ctx, "worker", 0, func() { killed = true }) || !killed {
		t.Fatal("not killed outside the window")
	}
	if g.deferred != 0 {
		t.Fatalf("deferred = %d, want 0 (no kill waited and then ran)", g.deferred)
	}
}

func TestCoverageJoinsOverlappingWindows(t *testing.T) {
	t0 := time.Unix(0, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	ws := []window{{kind: "a", from: at(10), to: at(30)}, {kind: "b", from: at(20), to: at(40)}, {kind: "c", from: at(90), to: at(120)}}
	if got := coverage(ws, at(0), at(100)); got != 0.4 {
		t.Fatalf("coverage = %v, want 0.4", got)
	}
}

func TestPercentileNearestRank(t *testing.T) {
	ds := []time.Duration{5, 1, 4, 2, 3}
	if p := percentile(ds, 0.5); p != 3 {
		t.Fatalf("p50 = %v", p)
	}
	if p := percentile(ds, 0.99); p != 5 {
		t.Fatalf("p99 = %v", p)
	}
	if p := percentile(nil, 0.5); p != 0 {
		t.Fatalf("p50 of nothing = %v", p)
	}
}

func TestVersionLogFollowsStoredVersionsAndRegressions(t *testing.T) {
	var v versionLog
	for _, l := range []string{
		`{"level":"INFO","msg":"token refresh","connection":"acme","outcome":"ok","old_version":3,"new_version":4}`,
		`{"level":"INFO","msg":"token refresh","connection":"acme","outcome":"ok","old_version":2,"new_version":3}`,
		`{"level":"WARN","msg":"token refresh","connection":"globex","outcome":"invalid_grant","old_version":5,"new_version":0}`,
		`{"level":"ERROR","msg":"connection's stored token went back to an older version: the database lost committed writes","connection":"acme","known_version":4,"stored_version":3}`,
		`{"level":"ERROR","msg":"connection's stored token went back to an older version: the database lost committed writes","connection":"acme","known_version":4,"stored_version":3}`,
		`{"level":"WARN","msg":"tokenguard: a rotation the database lost (a failover to an asynchronous standby, a restore) is stored again; its spent refresh token is never presented","connection":"initech","lost_version":7,"found_version":6,"stored_version":7}`,
		`{"level":"WARN","msg":"tokenguard: a rotation the database lost (a failover to an asynchronous standby, a restore) is stored again; its spent refresh token is never presented","connection":"initech","lost_version":8,"found_version":7,"stored_version":8}`,
		`not json`,
	} {
		v.line(l)
	}
	if w, n := v.writtenBackSince(0); len(w) != 1 || w[0] != "initech" || n != 2 {
		t.Fatalf("written back %q, %d lines; want [initech], 2", w, n)
	}
	if w, _ := v.writtenBackSince(2); len(w) != 0 {
		t.Fatalf("written back after the first 2: %q", w)
	}
	stored, rotations, regressions := v.snapshot()
	if stored["acme"] != 4 || stored["globex"] != 0 || rotations != 2 || regressions != 1 {
		t.Fatalf("stored %v, rotations %d, regressions %d; want acme 4, 2, 1 (the same loss from two processes is one)", stored, rotations, regressions)
	}
	if r := v.regressionsFrom(0); len(r) != 1 || r[0] != "acme 4 3" {
		t.Fatalf("regressions = %q", r)
	}
}

func TestEventsAroundAnAsynchronousFailoverAreExempt(t *testing.T) {
	var e events
	e.add(1)
	from := time.Now()
	e.add(2)
	e.add(3)
	to := time.Now()
	time.Sleep(time.Millisecond)
	e.add(4)
	if n := e.exemptBetween(from, to); n != 2 {
		t.Fatalf("exempted %d, want 2", n)
	}
	if ids := e.ids(); len(ids) != 2 || ids[0] != 1 || ids[1] != 4 {
		t.Fatalf("ids = %v, want [1 4]", ids)
	}
}

// The DPoP-bound connection's row holds only when its refreshes all
// count (stored or logged dropped), none was a reuse, no proof was
// refused, and there were refreshes at all; the controls break each.
func TestDPoPRowCatchesEachBreach(t *testing.T) {
	ok := sandbox.Stats{DPoPRefreshes: 10}
	if r := dpopRow(ok, 9, 1); !r.OK {
		t.Fatalf("a clean run fails: %s", r.Value)
	}
	for what, c := range map[string]struct {
		p       sandbox.Stats
		stored  int64
		dropped int
	}{
		"a reuse":           {sandbox.Stats{DPoPRefreshes: 10, DPoPReuse: 1}, 10, 0},
		"a rotation lost":   {ok, 9, 0},
		"a proof refused":   {sandbox.Stats{DPoPRefreshes: 10, DPoPRefused: 1}, 10, 0},
		"no refresh at all": {sandbox.Stats{}, 0, 0},
	} {
		if r := dpopRow(c.p, c.stored, c.dropped); r.OK {
			t.Errorf("%s passes: %s", what, r.Value)
		}
	}
}
