//go:build unix

package pgserver

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// needBinaries skips where no initdb is installed: there the initdb step
// cannot be tested, and Find says what to install instead.
func needBinaries(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts postgres")
	}
	if _, err := findBinaries(); err != nil {
		t.Skipf("initdb step not testable here: %v (Debian: apt-get install postgresql)", err)
	}
}

// testBase is a directory of the test's own for cluster directories, so
// the sweep and the checks see no other run's. Like /tmp, it lets the
// cluster's user (postgres or nobody when the tests run as root) create and
// remove its own entries.
func testBase(t *testing.T) string {
	t.Helper()
	base, err := os.MkdirTemp("", "pgserver-test-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(base, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	return base
}

func clusterDirs(t *testing.T, base string) []string {
	t.Helper()
	dirs, err := filepath.Glob(filepath.Join(base, dirPrefix+"*"))
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

func postmasterPid(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// awaitGone waits until the cluster directory is removed, its postmaster
// has exited and its URL no longer answers.
func awaitGone(t *testing.T, dir string, pid int, u string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, statErr := os.Stat(dir)
		alive := syscall.Kill(pid, 0) == nil
		pingErr := Ping(context.Background(), u, time.Second)
		if os.IsNotExist(statErr) && !alive && pingErr != nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster not cleaned up after 30s: dir exists=%v, postmaster %d alive=%v, answers=%v",
				statErr == nil, pid, alive, pingErr == nil)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestClusterServesDatabasesAndIsRemovedOnClose(t *testing.T) {
	needBinaries(t)
	ctx := context.Background()
	base := testBase(t)
	start := time.Now()
	s, err := startCluster(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster up in %s at %s", time.Since(start).Round(time.Millisecond), s.URL)
	dirs := clusterDirs(t, base)
	if len(dirs) != 1 {
		t.Fatalf("want one cluster directory, got %v", dirs)
	}
	pid := postmasterPid(t, dirs[0])

	dbURL, drop, err := CreateDatabase(ctx, s.URL, "pgserver_test")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	var got string
	if _, err := conn.Exec(ctx, "CREATE TABLE t (v text); INSERT INTO t VALUES ('kept')"); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, "SELECT v FROM t").Scan(&got); err != nil || got != "kept" {
		t.Fatalf("read back %q, %v", got, err)
	}
	conn.Close(ctx)
	if err := drop(ctx); err != nil {
		t.Fatal(err)
	}

	s.Close()
	// Close returns once the supervisor is done: no waiting needed.
	if _, err := os.Stat(dirs[0]); !os.IsNotExist(err) {
		t.Fatalf("cluster directory %s still there after Close: %v", dirs[0], err)
	}
	awaitGone(t, dirs[0], pid, s.URL)
}

// TestHelperOwner is the owning process of TestClusterRemovedWhenOwnerKilled:
// it starts a cluster, prints its URL and supervisor pid, and waits to be
// killed.
func TestHelperOwner(t *testing.T) {
	base := os.Getenv("PGSERVER_HELPER_BASE")
	if base == "" {
		t.Skip("helper process only")
	}
	s, err := startCluster(context.Background(), base)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("url", s.URL)
	select {}
}

func startOwner(t *testing.T, base string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperOwner$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PGSERVER_HELPER_BASE="+base)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "url ") {
		t.Fatalf("helper said %q, %v", line, err)
	}
	return cmd, strings.TrimSpace(strings.TrimPrefix(line, "url "))
}

func TestClusterRemovedWhenOwnerKilled(t *testing.T) {
	needBinaries(t)
	base := testBase(t)
	owner, u := startOwner(t, base)
	if err := Ping(context.Background(), u, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	dirs := clusterDirs(t, base)
	if len(dirs) != 1 {
		t.Fatalf("want one cluster directory, got %v", dirs)
	}
	pid := postmasterPid(t, dirs[0])

	// SIGKILL: no deferred function, no test cleanup runs in the owner.
	if err := owner.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = owner.Wait()
	awaitGone(t, dirs[0], pid, u)
}

// When the owner and its supervisor are both killed, postgres runs on;
// the next start sweeps it away.
func TestSweepStopsAndRemovesOrphanedCluster(t *testing.T) {
	needBinaries(t)
	base := testBase(t)
	owner, u := startOwner(t, base)
	dirs := clusterDirs(t, base)
	if len(dirs) != 1 {
		t.Fatalf("want one cluster directory, got %v", dirs)
	}
	pid := postmasterPid(t, dirs[0])
	sup := parentOf(t, pid)
	// The supervisor and its watcher, not postgres.
	for _, p := range append(childrenOf(t, sup), sup) {
		if p != pid {
			if err := syscall.Kill(p, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := owner.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = owner.Wait()
	if err := Ping(context.Background(), u, 5*time.Second); err != nil {
		t.Fatalf("postgres should outlive its killed supervisor: %v", err)
	}

	// A live owner's directory is never swept, however old.
	live, err := startCluster(context.Background(), base)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	old := staleAfter
	staleAfter = 0
	defer func() { staleAfter = old }()

	sweep(base)
	awaitGone(t, dirs[0], pid, u)
	if err := Ping(context.Background(), live.URL, 5*time.Second); err != nil {
		t.Fatalf("sweep stopped a cluster whose owner lives: %v", err)
	}
}

func parentOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	// pid (comm) state ppid ...
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	ppid, err := strconv.Atoi(fields[1])
	if err != nil {
		t.Fatal(err)
	}
	return ppid
}

func childrenOf(t *testing.T, parent int) []int {
	t.Helper()
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var kids []int
	for _, st := range stats {
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(st)))
		if _, err := os.Stat(st); err == nil && pid != parent && func() bool {
			b, err := os.ReadFile(st)
			if err != nil {
				return false
			}
			fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
			return len(fields) > 1 && fields[1] == strconv.Itoa(parent)
		}() {
			kids = append(kids, pid)
		}
	}
	return kids
}

func TestFindFallsThroughToInitdb(t *testing.T) {
	needBinaries(t)
	var notes []string
	s, err := Find(context.Background(), Options{
		URLVar: "PGSERVER_TEST_UNSET_URL",
		Skip:   []string{StepEnv, StepDocker, StepLocal},
		Note:   func(n string) { notes = append(notes, n) },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Source != "initdb" {
		t.Fatalf("source %q, want initdb (notes: %v)", s.Source, notes)
	}
	if err := Ping(context.Background(), s.URL, 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestClusterRestartKeepsDataPortAndDirectory(t *testing.T) {
	needBinaries(t)
	ctx := context.Background()
	base := testBase(t)
	s, err := startCluster(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	dirs := clusterDirs(t, base)
	if len(dirs) != 1 {
		t.Fatalf("want one cluster directory, got %v", dirs)
	}
	before := postmasterPid(t, dirs[0])
	conn, err := pgx.Connect(ctx, s.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE TABLE t (v text); INSERT INTO t VALUES ('kept')"); err != nil {
		t.Fatal(err)
	}

	took, err := s.Restart(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("restarted in %s", took.Round(time.Millisecond))
	if err := conn.Ping(ctx); err == nil {
		t.Fatal("a session from before the restart still answers: postgres was not restarted")
	}
	if after := postmasterPid(t, dirs[0]); after == before {
		t.Fatalf("postmaster pid %d unchanged", after)
	}
	conn2, err := pgx.Connect(ctx, s.URL) // same URL: same port
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close(ctx)
	var got string
	if err := conn2.QueryRow(ctx, "SELECT v FROM t").Scan(&got); err != nil || got != "kept" {
		t.Fatalf("after restart read %q, %v", got, err)
	}
	if _, err := s.Restart(ctx); err != nil {
		t.Fatalf("second restart: %v", err)
	}

	s.Close()
	if _, err := os.Stat(dirs[0]); !os.IsNotExist(err) {
		t.Fatalf("cluster directory %s still there after Close: %v", dirs[0], err)
	}
}
