//go:build unix

package pgserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// A throw-away cluster lives in its own directory under the temporary
// directory: data/ (made by initdb), postgres.log, and owner.lock, which
// the owning process holds locked while it lives.
const dirPrefix = "tokenguard-pg-"

// supervisor is the shell that runs postgres for the owner. Its standard
// input is a pipe whose write end only the owner holds. A line "restart"
// stops postgres (fast shutdown) and starts it again on the same data
// directory and port; end of input means the owner closed the server or
// died, however it died (SIGKILL, a test timeout): then postgres gets a
// fast shutdown and the directory is removed. If postgres exits on its
// own, its status goes to postgres.exit. Arguments: postgres binary,
// directory, postgres options.
const supervisor = `
exec 3<&0 </dev/null
pg=$1 dir=$2
shift 2
{
  while read -r cmd <&3; do
    [ "$cmd" = restart ] && : >"$dir/restart" && kill -INT "$(cat "$dir/pg.pid")" 2>/dev/null
  done
  : >"$dir/stop"
  kill -INT "$(cat "$dir/pg.pid")" 2>/dev/null
} &
watch_pid=$!
exec 3<&-
while :; do
  "$pg" -D "$dir/data" "$@" >>"$dir/postgres.log" 2>&1 &
  pg_pid=$!
  echo "$pg_pid" >"$dir/pg.pid"
  wait "$pg_pid"
  status=$?
  [ -e "$dir/stop" ] && break
  if [ -e "$dir/restart" ]; then rm -f "$dir/restart"; continue; fi
  echo "$status" >"$dir/postgres.exit"
  break
done
wait "$watch_pid"
rm -rf "$dir"
`

// staleAfter is how old an unowned cluster directory must be before the
// sweep removes it: younger ones may still be in their supervisor's hands.
var staleAfter = time.Minute

// startCluster makes and starts a throw-away cluster in a new directory
// under base (the temporary directory when empty). It is stopped and
// removed by Server.Close, or by its supervisor when this process ends.
func startCluster(ctx context.Context, base string) (*Server, error) {
	return startClusterAs(ctx, base, false)
}

// StartStandby starts a throw-away cluster in standby mode without a
// primary: a server in recovery (pg_is_in_recovery() is true) that
// answers read-only queries, as a replica does. Close stops it.
func StartStandby(ctx context.Context) (*Server, error) {
	return startClusterAs(ctx, "", true)
}

func startClusterAs(ctx context.Context, base string, standby bool) (*Server, error) {
	if base == "" {
		base = os.TempDir()
	}
	bin, err := findBinaries()
	if err != nil {
		return nil, err
	}
	cred, err := clusterUser()
	if err != nil {
		return nil, err
	}
	sweep(base)
	for attempt := 1; ; attempt++ {
		s, err := startClusterOnce(ctx, bin, base, cred, standby)
		// The free port is found before postgres binds it; another
		// process may take it in between.
		if err == nil || !errors.Is(err, errPortTaken) || attempt == 3 {
			return s, err
		}
	}
}

var errPortTaken = errors.New("port taken")

func startClusterOnce(ctx context.Context, bin, base string, cred *syscall.Credential, standby bool) (*Server, error) {
	dir, err := os.MkdirTemp(base, dirPrefix)
	if err != nil {
		return nil, err
	}
	lock, err := lockOwner(dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if cred != nil {
		// initdb refuses to run as root: the cluster's files belong to
		// the unprivileged user that runs it.
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			lock.Close()
			_ = os.RemoveAll(dir)
			return nil, err
		}
	}
	initdb := command(cred, filepath.Join(bin, "initdb"), "-D", filepath.Join(dir, "data"),
		"-U", "postgres", "--auth=trust", "--no-locale", "-E", "UTF8", "--no-sync")
	if out, err := initdb.CombinedOutput(); err != nil {
		lock.Close()
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("%s as %s in %s: %w: %s", initdb.Path, who(cred), dir, err, lastLines(out, 5))
	}
	if standby {
		// Read by postgres only: it need not belong to the cluster's user.
		if err := os.WriteFile(filepath.Join(dir, "data", "standby.signal"), nil, 0o644); err != nil {
			lock.Close()
			_ = os.RemoveAll(dir)
			return nil, err
		}
	}
	port, err := freePort()
	if err != nil {
		lock.Close()
		_ = os.RemoveAll(dir)
		return nil, err
	}

	lifeline, owner, err := os.Pipe()
	if err != nil {
		lock.Close()
		_ = os.RemoveAll(dir)
		return nil, err
	}
	sup := command(cred, "/bin/sh", "-c", supervisor, "pgserver-supervisor", filepath.Join(bin, "postgres"), dir,
		"-c", "listen_addresses=127.0.0.1", "-p", strconv.Itoa(port), "-k", dir,
		// Nothing here outlives the run: durability buys nothing.
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=200")
	sup.Stdin = lifeline
	sup.Dir = dir
	// Its own session: a Ctrl-C at the terminal stops the owner, and the
	// supervisor then cleans up rather than dying with it.
	sup.SysProcAttr.Setsid = true
	if err := sup.Start(); err != nil {
		lifeline.Close()
		owner.Close()
		lock.Close()
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start postgres supervisor: %w", err)
	}
	lifeline.Close()
	exited := make(chan struct{})
	go func() { _ = sup.Wait(); close(exited) }()
	// mu keeps a restart and the close apart: the supervisor must not be
	// told to stop while it starts postgres again.
	var mu sync.Mutex
	stop := func() {
		mu.Lock()
		defer mu.Unlock()
		owner.Close() // end of input: the supervisor stops postgres and removes dir
		select {
		case <-exited:
		case <-time.After(60 * time.Second):
		}
		lock.Close()
	}

	u := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	if err := awaitReady(ctx, u, dir); err != nil {
		stop()
		return nil, err
	}
	restart := func(ctx context.Context) (time.Duration, error) {
		mu.Lock()
		defer mu.Unlock()
		pidFile := filepath.Join(dir, "pg.pid")
		before, _ := os.ReadFile(pidFile)
		start := time.Now()
		if _, err := owner.WriteString("restart\n"); err != nil {
			return 0, fmt.Errorf("restart postgres: %w", err)
		}
		// Readiness counts once the supervisor started the new postmaster.
		for now, _ := os.ReadFile(pidFile); bytes.Equal(now, before); now, _ = os.ReadFile(pidFile) {
			if time.Since(start) > time.Minute || ctx.Err() != nil {
				return time.Since(start), errors.New("restart postgres: the server did not stop")
			}
			time.Sleep(10 * time.Millisecond)
		}
		err := awaitReady(ctx, u, dir)
		return time.Since(start), err
	}
	return &Server{URL: u, Source: "initdb", close: stop, restart: restart}, nil
}

// awaitReady waits until the server at u answers, postgres exits, or a
// minute passes.
func awaitReady(ctx context.Context, u, dir string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := Ping(ctx, u, time.Second)
		if err == nil {
			return nil
		}
		if code, rerr := os.ReadFile(filepath.Join(dir, "postgres.exit")); rerr == nil {
			log, _ := os.ReadFile(filepath.Join(dir, "postgres.log"))
			err := fmt.Errorf("postgres exited with status %s: %s", strings.TrimSpace(string(code)), lastLines(log, 5))
			if bytes.Contains(log, []byte("Address already in use")) {
				err = fmt.Errorf("%w: %w", errPortTaken, err)
			}
			return err
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("postgres in %s did not answer: %w", dir, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// findBinaries returns the directory holding initdb and postgres: the one
// initdb in PATH comes from, else the newest /usr/lib/postgresql/*/bin
// (Debian and Ubuntu keep them out of PATH).
func findBinaries() (string, error) {
	var dirs []string
	if p, err := exec.LookPath("initdb"); err == nil {
		if p, err := filepath.EvalSymlinks(p); err == nil {
			dirs = append(dirs, filepath.Dir(p))
		}
	}
	debian, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(debian, func(i, j int) bool { return version(debian[i]) > version(debian[j]) })
	dirs = append(dirs, debian...)
	for _, d := range dirs {
		if isExecutable(filepath.Join(d, "initdb")) && isExecutable(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	return "", errors.New("no initdb and postgres in PATH or /usr/lib/postgresql/*/bin")
}

func version(bin string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(bin)), 64)
	return v
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// clusterUser is who runs initdb and postgres: this process's user, or,
// when that is root (which both refuse), postgres or else nobody.
func clusterUser() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil || uid == 0 {
			continue
		}
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
	}
	return nil, errors.New("running as root, which initdb refuses, and there is no user postgres or nobody to run it as")
}

func who(cred *syscall.Credential) string {
	if cred == nil {
		return "this user"
	}
	if u, err := user.LookupId(strconv.Itoa(int(cred.Uid))); err == nil {
		return "user " + u.Username
	}
	return "uid " + strconv.Itoa(int(cred.Uid))
}

// command runs as cred (nil: this user), without the PG* variables that
// would point initdb or postgres elsewhere.
func command(cred *syscall.Credential, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = "/" // the test's directory may be closed to cred's user
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") && !strings.HasPrefix(kv, "LC_") && !strings.HasPrefix(kv, "LANG=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "LC_ALL=C")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	return cmd
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// lockOwner locks dir/owner.lock for as long as this process holds the
// returned file; the kernel drops the lock when the process dies.
func lockOwner(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "owner.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	return f, nil
}

// sweep removes cluster directories under base whose owner and supervisor
// are both gone (say, both killed), stopping a postgres still running
// there. Directories it cannot remove (another user's) are left alone.
func sweep(base string) {
	dirs, _ := filepath.Glob(filepath.Join(base, dirPrefix+"*"))
	for _, d := range dirs {
		fi, err := os.Lstat(d)
		if err != nil || !fi.IsDir() || time.Since(fi.ModTime()) < staleAfter {
			continue
		}
		if f, err := os.Open(filepath.Join(d, "owner.lock")); err == nil {
			held := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil
			f.Close()
			if held {
				continue
			}
		}
		stopOrphan(filepath.Join(d, "data"))
		_ = os.RemoveAll(d)
	}
}

// stopOrphan stops the postmaster of data, if one is running: the pid in
// postmaster.pid counts only if that process works in data, so a reused
// pid is never signalled.
func stopOrphan(data string) {
	b, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	if err != nil || pid <= 0 {
		return
	}
	cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	real, rerr := filepath.EvalSymlinks(data)
	if err != nil || rerr != nil || filepath.Clean(cwd) != real {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGQUIT) // immediate shutdown: nothing in it is kept
	for i := 0; i < 100 && syscall.Kill(pid, 0) == nil; i++ {
		time.Sleep(50 * time.Millisecond)
	}
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
