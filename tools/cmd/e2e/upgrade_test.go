package e2e

import (
	"net"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/internal/release"
)

// A rolling deploy from the previous release, whose tables have generic
// names (connections, tokens, providers...): its server, worker and batch
// run under load on a database its tokenctl migrated; this release's
// tokenctl migrate renames the tables while they run (migration 000012);
// this release's three apps start beside them; then the old ones stop.
// Tokens expire every 2 s throughout. The control renames the tables
// without the views the migration leaves under the old names: the old
// processes then fail, which is what the test would see if the
// migration broke them.
func TestRollingUpgradeFromThePreviousRelease(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds two releases of the apps and needs Postgres")
	}
	bin := buildApps(t)
	old := buildPrevious(t)
	t.Run("OldAndNewSideBySide", func(t *testing.T) { t.Parallel(); testRollingUpgrade(t, bin, old, false) })
	t.Run("ControlRenamedWithoutViews", func(t *testing.T) { t.Parallel(); testRollingUpgrade(t, bin, old, true) })
}

// buildPrevious builds the previous release's server, worker, batch and
// tokenctl from git (release.Previous) into a directory of their own.
func buildPrevious(t *testing.T) string {
	t.Helper()
	src := t.TempDir()
	if err := release.Extract(release.Previous, src); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	args := []string{"build", "-o", dir + string(os.PathSeparator)}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, "./cmd/server", "./cmd/worker", "./cmd/batch", "./cmd/tokenctl")
	start := time.Now()
	cmd := exec.Command("go", args...)
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build of the previous release: %v\n%s", err, out)
	}
	t.Logf("built the previous release's apps (%s) in %v", release.Previous[:7], time.Since(start).Round(time.Millisecond))
	return dir
}

func testRollingUpgrade(t *testing.T, bin, oldBin string, dropViews bool) {
	const conn = "acme"
	s := newStack(t, oldBin, stackOpts{lifetime: lifetime, skew: skew})
	s.migrate() // the previous release's tokenctl: its tables, its API key
	s.importGrant(conn)
	oldServer := s.start("server")
	s.waitHealthy(oldServer)
	oldWorker := s.start("worker")
	oldBatch := s.start("batch", "--every", "500ms")
	dOld := startDriver(s, conn, 3, 50*time.Millisecond)
	loadStart := time.Now()
	time.Sleep(5 * time.Second) // two expiries on the previous release alone

	// This release migrates while the old processes run.
	migrated := time.Now()
	if r := run(t, bin, "tokenctl", s.env, "", "migrate"); r.code != 0 {
		t.Fatalf("tokenctl migrate of this release: exit %d: %s", r.code, r.stderr)
	}
	if dropViews {
		sql(t, s.dbURL, `DROP VIEW connections, tokens, api_keys, providers, connect_sessions, client_auth_styles, refresh_leases, webhook_outbox`)
	}
	oldFailedBefore := dOld.bad.Load()
	// The previous release's tokenctl reads through the views too.
	if r := run(t, oldBin, "tokenctl", s.env, "", "status", "--connection", conn); (r.code == 0) == dropViews {
		t.Errorf("the previous release's tokenctl status after the migration: exit %d: %s", r.code, r.stderr)
	}

	// This release's apps beside them: another server address, the same
	// database, provider and API key.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ns := *s
	ns.bin, ns.addr = bin, ln.Addr().String()
	ln.Close()
	ns.env = append(slices.Clone(s.env), "HTTP_ADDR="+ns.addr)
	newServer := ns.start("server")
	ns.waitHealthy(newServer)
	newWorker := ns.start("worker")
	newBatch := ns.start("batch", "--every", "500ms")
	dNew := startDriver(&ns, conn, 3, 50*time.Millisecond)
	time.Sleep(8 * time.Second) // four expiries with both releases

	// The old processes go; this release's carry on alone. (In the
	// control they may have failed for good: they are killed.)
	dOld.finish()
	for _, a := range []*app{oldBatch, oldWorker, oldServer} {
		if dropViews {
			a.Kill()
			<-a.Done()
		} else {
			s.stop(a)
		}
	}
	time.Sleep(4 * time.Second)
	dNew.finish()
	ids := append(dOld.eventIDs(), dNew.eventIDs()...)
	js := waitEvents(t, s.dbURL, ids, 20*time.Second)
	ns.stop(newBatch)
	ns.stop(newWorker)
	ns.stop(newServer)
	st := s.sb.Stats()
	_, status := storedVersionStatus(t, s.dbURL, conn)

	var oldRoundsFailed, newRoundsFailed int
	oldRounds, newRounds := rounds(t, oldBatch), rounds(t, newBatch)
	for _, r := range oldRounds {
		oldRoundsFailed += r.Failed + len(r.Errors)
	}
	for _, r := range newRounds {
		newRoundsFailed += r.Failed + len(r.Errors)
	}
	incomplete := 0
	for _, id := range ids {
		if j, ok := js[id]; !ok || j.State != "completed" {
			incomplete++
		}
	}
	t.Logf("old: %d calls (%d failed, %d after the migration), %d batch rounds (%d failures); new: %d calls (%d failed), %d batch rounds (%d failures); %d of %d events not completed; provider: %d refreshes, %d reuse, %d×401; status %s; migrated %v into the load",
		dOld.ok.Load(), dOld.bad.Load(), dOld.bad.Load()-oldFailedBefore, len(oldRounds), oldRoundsFailed,
		dNew.ok.Load(), dNew.bad.Load(), len(newRounds), newRoundsFailed, incomplete, len(ids),
		st.Refreshes, st.RefreshReuse, st.Resource401, status, migrated.Sub(loadStart).Round(time.Millisecond))

	if dropViews {
		// The control: without the views the previous release's
		// processes fail once they need the database.
		if dOld.bad.Load()-oldFailedBefore == 0 && oldRoundsFailed == 0 && incomplete == 0 {
			t.Errorf("control: the old processes never failed with the tables renamed and no views: the test would not see a broken upgrade")
		}
		return
	}
	dOld.check()
	dNew.check()
	if oldRoundsFailed > 0 || newRoundsFailed > 0 || len(oldRounds) < 5 || len(newRounds) < 5 {
		t.Errorf("batch: old %d rounds, %d failures; new %d rounds, %d failures", len(oldRounds), oldRoundsFailed, len(newRounds), newRoundsFailed)
	}
	if incomplete > 0 {
		t.Errorf("%d of %d events not completed", incomplete, len(ids))
	}
	if st.RefreshReuse != 0 {
		t.Errorf("refresh-token reuse = %d", st.RefreshReuse)
	}
	if status != "active" {
		t.Errorf("the connection is %s", status)
	}
	if st.Refreshes < 6 {
		t.Errorf("%d refreshes: the tokens did not expire several times", st.Refreshes)
	}
	if v := storedVersion(t, &ns, conn); v != st.Refreshes+1 {
		t.Errorf("stored version %d after %d refreshes", v, st.Refreshes)
	}
}
