package e2e

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokenguard/tokenguard/internal/waitfor"
	"github.com/tokenguard/tokenguard/tools/internal/demo"
)

const (
	lifetime = 3 * time.Second
	skew     = time.Second
)

func TestApps(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds the apps and needs Postgres")
	}
	bin := buildApps(t)
	// Each subtest has its own database and provider; running them side by
	// side keeps the package within CI's budget.
	t.Run("ConfigAndInputErrors", func(t *testing.T) { t.Parallel(); testErrors(t, bin) })
	t.Run("ThreeAppsShareOneConnection", func(t *testing.T) { t.Parallel(); testThreeApps(t, bin) })
	t.Run("KillWorkerHoldingTheRefreshLock", func(t *testing.T) { t.Parallel(); testKillWorker(t, bin) })
	t.Run("RefreshAheadAndRotateKey", func(t *testing.T) { t.Parallel(); testOperations(t, bin) })
	t.Run("ProviderFaultsThreeApps", func(t *testing.T) { t.Parallel(); testProviderFaults(t, bin) })
	t.Run("RevokedGrantMarkedOnce", func(t *testing.T) { t.Parallel(); testRevokedGrantOnce(t, bin) })
	t.Run("NoTokenInAnyOutput", func(t *testing.T) { t.Parallel(); testNoTokenLeaks(t, bin) })
	t.Run("KillLockHolderOthersProceed", func(t *testing.T) { t.Parallel(); testKillHolderOthersProceed(t, bin) })
	t.Run("InvalidClientWindowThreeApps", func(t *testing.T) { t.Parallel(); testInvalidClientWindow(t, bin) })
	t.Run("FacingANetwork", func(t *testing.T) { t.Parallel(); testSecurity(t, bin) })
	t.Run("HijackedConnectLink", func(t *testing.T) { t.Parallel(); testHijackedLink(t, bin, false) })
	t.Run("HijackedConnectLinkControl", func(t *testing.T) { t.Parallel(); testHijackedLink(t, bin, true) })
	t.Run("ConsentPageCSRF", func(t *testing.T) { t.Parallel(); testConsentPageCSRF(t, bin) })
	t.Run("ScopedKeysURLsAndSealedRows", func(t *testing.T) { t.Parallel(); testKeysAndEdges(t, bin) })
	t.Run("TenantIsolation", func(t *testing.T) { t.Parallel(); testTenantIsolation(t, bin) })
	t.Run("PatternLimitedListingCost", func(t *testing.T) { t.Parallel(); testListingCost(t, bin) })
	t.Run("ReactivateAndCheck", func(t *testing.T) { t.Parallel(); testReactivateAndCheck(t, bin) })
	t.Run("SIGTERMDuringARefreshKeepsTheRotatedToken", func(t *testing.T) { t.Parallel(); testSIGTERMDuringRefresh(t, bin) })
	t.Run("SandboxFirstToken", func(t *testing.T) { t.Parallel(); testSandboxFirstToken(t, bin) })
	t.Run("ReadmeConnectSession", func(t *testing.T) { t.Parallel(); testReadmeConnectSession(t, bin) })
	t.Run("TwoProvidersSecretRotation", func(t *testing.T) { t.Parallel(); testTwoProviders(t, bin) })
	t.Run("ConnectionsListedAndDisconnected", func(t *testing.T) { t.Parallel(); testConnections(t, bin) })
	t.Run("TokenAPI", func(t *testing.T) { t.Parallel(); testTokenAPI(t, bin) })
	t.Run("ClientsOwnTests", func(t *testing.T) { t.Parallel(); testClients(t, bin) })
	t.Run("PolyglotOneConnection", func(t *testing.T) { t.Parallel(); testPolyglot(t, bin) })
	t.Run("PolyglotControlSelfRefresh", func(t *testing.T) { t.Parallel(); testPolyglotControl(t, bin) })
	t.Run("FirstGrantThroughTheRefreshersClient", func(t *testing.T) { t.Parallel(); testFirstGrant(t, bin) })
	t.Run("DexRevokedGrantNeedsReauth", func(t *testing.T) { t.Parallel(); testDexRevokedGrant(t, bin) })
	t.Run("DexWrongSecretControl", func(t *testing.T) { t.Parallel(); testDexWrongSecret(t, bin) })
	t.Run("ScopesReducedByARefresh", func(t *testing.T) { t.Parallel(); testScopesReduced(t, bin) })
	t.Run("ScopesUnchangedControls", func(t *testing.T) { t.Parallel(); testScopesUnchanged(t, bin) })
	t.Run("UnknownRefusalFailingAcrossProcesses", func(t *testing.T) { t.Parallel(); testUnknownRefusalFailing(t, bin) })
	t.Run("TracesThroughServerAndWorker", func(t *testing.T) { t.Parallel(); testTraces(t, bin) })
	t.Run("FrozenProviderAnswersItsQueue", func(t *testing.T) { t.Parallel(); testFrozenProvider(t, bin, false) })
	t.Run("FrozenProviderControlGivesUpOnTheAnswer", func(t *testing.T) { t.Parallel(); testFrozenProvider(t, bin, true) })
}

// testThreeApps runs server, worker and batch --every as processes through
// several expiry cycles of one connection.
func testThreeApps(t *testing.T, bin string) {
	s := newStack(t, bin, stackOpts{lifetime: lifetime, skew: skew})
	s.migrate()
	const conn = "acme"
	granted := s.importGrant(conn)
	server := s.start("server")
	s.waitHealthy(server)
	worker := s.start("worker")
	loadStart := time.Now()
	batchApp := s.start("batch", "--every", "500ms")
	d := startDriver(s, conn, 3, 50*time.Millisecond)

	time.Sleep(12 * time.Second)
	d.finish()
	ids := d.eventIDs()
	js := waitEvents(t, s.dbURL, ids, 20*time.Second)
	loadEnd := time.Now()
	s.stop(batchApp)
	s.stop(worker)
	s.stop(server)
	st := s.sb.Stats()
	s.checkPooled()

	// No failure in any app.
	d.check()
	var roundCalls, roundFailed int
	rs := rounds(t, batchApp)
	for _, r := range rs {
		roundCalls += r.Succeeded
		roundFailed += r.Failed + len(r.Errors)
	}
	if roundFailed > 0 || len(rs) < 10 {
		t.Errorf("batch: %d rounds, %d failures: %+v", len(rs), roundFailed, rs)
	}
	// Every event processed exactly once: completed at its first attempt,
	// and one accepted worker call per event at the provider.
	for _, id := range ids {
		j, ok := js[id]
		if !ok || j.State != "completed" || j.Attempt != 1 || j.Errors != 0 {
			t.Errorf("event %d: %+v (present: %t), want completed at attempt 1 without errors", id, j, ok)
		}
	}
	// Every accepted call at the provider is one an app counted, and each
	// app announced itself.
	want := map[string]int64{"tokenguard-server": d.ok.Load(), "tokenguard-worker": int64(len(ids)), "tokenguard-batch": int64(roundCalls)}
	for agent, n := range want {
		if got := st.ResourceByAgent[agent]; got != n {
			t.Errorf("provider saw %d calls from %s, the app made %d", got, agent, n)
		}
	}
	if len(st.ResourceByAgent) != len(want) {
		t.Errorf("calls by user agent = %v, want only the three apps", st.ResourceByAgent)
	}
	// Zero reuse; one refresh per expiry.
	if st.RefreshReuse != 0 {
		t.Errorf("refresh-token reuse = %d", st.RefreshReuse)
	}
	// The provider's view of the caches: every refresh revokes the previous
	// access token, so a process presenting a superseded token is answered
	// 401. A request already in flight when another process refreshes can
	// meet that (the transport then recovers it, so no app saw a failure);
	// a cache serving superseded tokens would show here as a stream of them.
	if limit := st.Refreshes * 3; st.Resource401 > limit {
		t.Errorf("the provider answered %d calls 401 over %d refreshes: processes kept presenting superseded tokens", st.Resource401, st.Refreshes)
	}
	expected := demo.ExpectedRefreshes(granted, loadStart, loadEnd, lifetime-skew)
	if diff := st.Refreshes - int64(expected); diff < -1 || diff > 1 {
		t.Errorf("refreshes = %d, want %d ±1 (%v of use, %v tokens refreshed %v early)", st.Refreshes, expected,
			loadEnd.Sub(loadStart).Round(time.Millisecond), lifetime, skew)
	}
	// The store agrees: one version per refresh on top of the grant.
	if v := storedVersion(t, s, conn); v != st.Refreshes+1 {
		t.Errorf("stored version %d after %d refreshes", v, st.Refreshes)
	}
	t.Logf("server %d calls, worker %d events, batch %d rounds; provider: %d refreshes (expected %d), %d reuse, %d×401",
		d.ok.Load(), len(ids), len(rs), st.Refreshes, expected, st.RefreshReuse, st.Resource401)
}

// testKillWorker kills the worker with SIGKILL while its refresh request
// is at the provider (it holds the refresh lease, no lock), then restarts
// it.
func testKillWorker(t *testing.T, bin string) {
	// The provider holds the worker's refresh request until the kill.
	held := newHeldRefresh()
	s := newStack(t, bin, stackOpts{lifetime: lifetime, skew: skew, fault: held.fault,
		// Events of a dead worker are retried 3+2+2 = 7s after they started.
		// The dead worker's request is unresolved until the answer deadline:
		// its lease is abandoned a second after it, and the next process
		// probes the provider and presents the token once.
		extraEnv: []string{"WORKER_JOB_TIMEOUT=3s", "TOKEN_ANSWER_DEADLINE=2s"}})
	s.migrate()
	const conn = "acme"
	s.importGrant(conn)
	server := s.start("server")
	s.waitHealthy(server)
	worker := s.start("worker")
	d := startDriver(s, conn, 2, 50*time.Millisecond)
	time.Sleep(2 * time.Second)

	// Only the worker uses the token now, so the next refresh is its own.
	d.pause.Lock()
	held.armed.Store(true)
	select {
	case <-held.hit:
	case <-time.After(2 * lifetime):
		held.let()
		d.pause.Unlock()
		t.Fatal("no refresh reached the provider")
	}
	if n, l := advisoryLocks(t, s.dbURL), leaseRows(t, s.dbURL); n != 0 || l != 1 {
		t.Errorf("while the worker's refresh is at the provider: %d lock holders, %d leases; want 0 and 1", n, l)
	}
	if err := syscall.Kill(worker.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	worker.Wait()
	held.let()
	// The dead worker's request is unresolved until its lease runs out (the
	// answer deadline and a second): a caller without a still-valid token
	// meanwhile gets 503, as testKillHolderOthersProceed measures. The load
	// resumes once it has run out; the first caller then records the lost
	// answer, probes the provider and presents the token once.
	waitfor.Until(t, 5*time.Second, "the dead worker's lease never ran out", func() bool {
		return count(t, s.dbURL, `SELECT count(*) FROM tokenguard_refresh_leases WHERE until > now()`) == 0
	})

	d.pause.Unlock()
	worker2 := s.start("worker")
	time.Sleep(3 * time.Second)
	d.finish()

	ids := d.eventIDs()
	js := waitEvents(t, s.dbURL, ids, 60*time.Second)
	// The connection stays usable.
	if code, body := s.do("GET", "/connections/"+conn+"/resource", ""); code != 200 {
		t.Errorf("after the kill: %d %s", code, body)
	}
	s.stop(worker2)
	s.stop(server)
	st := s.sb.Stats()

	d.check()
	retried := 0
	for _, id := range ids {
		j, ok := js[id]
		if !ok || j.State != "completed" {
			t.Errorf("event %d lost: %+v (present: %t)", id, j, ok)
		}
		if j.Attempt > 1 {
			retried++
		}
	}
	if retried == 0 {
		t.Error("no event was retried, yet the worker was killed while handling one")
	}
	if st.RefreshReuse != 0 {
		t.Errorf("refresh-token reuse = %d", st.RefreshReuse)
	}
	if st.RefreshFaults != 1 {
		t.Errorf("faulted refreshes = %d, want the one held while the worker was killed", st.RefreshFaults)
	}
	// The store matches the provider.
	out := run(t, s.bin, "tokenctl", s.env, "", "status", "--connection", conn)
	if out.code != 0 || !strings.Contains(out.stdout, " active ") {
		t.Errorf("tokenctl status: exit %d\n%s%s", out.code, out.stdout, out.stderr)
	}
	if v := storedVersion(t, s, conn); v != st.Refreshes+1 {
		t.Errorf("stored version %d after %d refreshes", v, st.Refreshes)
	}
	t.Logf("%d events, %d retried after the kill; provider: %d refreshes, %d reuse, %d×401",
		len(ids), retried, st.Refreshes, st.RefreshReuse, st.Resource401)
}

// advisoryLocks counts granted connection locks (tokenguard's namespace).
func advisoryLocks(t *testing.T, dbURL string) int {
	return count(t, dbURL, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND classid = $1 AND objsubid = 2 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, 0x746b6764)
}

// leaseRows counts the refresh leases stored.
func leaseRows(t *testing.T, dbURL string) int {
	return count(t, dbURL, `SELECT count(*) FROM tokenguard_refresh_leases`)
}

// count runs a count(*) query on a connection of its own.
func count(t *testing.T, dbURL, query string, args ...any) int {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var n int
	if err := c.QueryRow(ctx, query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

var versionCol = regexp.MustCompile(`(?m)^\S+\s+\S+\s+\S+ \([^)]*\)\s+(\d+)\s`)

// storedVersion reads the connection's version from tokenctl status.
func storedVersion(t *testing.T, s *stack, conn string) int64 {
	t.Helper()
	out := run(t, s.bin, "tokenctl", s.env, "", "status", "--connection", conn)
	m := versionCol.FindStringSubmatch(out.stdout)
	if out.code != 0 || m == nil {
		t.Fatalf("tokenctl status: exit %d\n%s%s", out.code, out.stdout, out.stderr)
	}
	v, _ := strconv.ParseInt(m[1], 10, 64)
	return v
}
