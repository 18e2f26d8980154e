// Package pgbouncer starts a PgBouncer (the Debian package's binary) in
// transaction pooling mode in front of a test Postgres, so that tests can
// run the apps through the pooler most fleets put before their database.
// It is test tooling: production binaries never link it.
package pgbouncer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ExecMode is the pgx query mode that works through PgBouncer before 1.21
// in transaction mode, which forwards no named prepared statement from one
// transaction to the next: pgx's default caches prepared statements per
// connection. "exec" uses the unnamed statement of each round trip.
const ExecMode = "default_query_exec_mode=exec"

// supervisor runs PgBouncer until its standard input ends, which happens
// when the owner closes it or dies: no PgBouncer outlives its test.
const supervisor = `
exec 3<&0
"$@" </dev/null 3<&- &
pid=$!
(cat <&3 >/dev/null; kill -TERM "$pid" 2>/dev/null) &
exec 3<&-
wait "$pid"
`

// Bouncer is a running PgBouncer.
type Bouncer struct {
	// Addr is where it listens (127.0.0.1:port).
	Addr  string
	cmd   *exec.Cmd
	owner *os.File // its end closed, the supervisor stops PgBouncer
	dir   string
	mu    sync.Mutex
	log   bytes.Buffer
	done  chan struct{}
}

// Binary finds pgbouncer on PATH or where Debian installs it.
func Binary() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer", "/usr/local/bin/pgbouncer"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errors.New("pgbouncer not found (Debian: apt-get install pgbouncer)")
}

// Start runs PgBouncer in transaction pooling mode on a free local port,
// forwarding every database name to the server of upstream (a postgres://
// URL; its user and password are the ones PgBouncer accepts and logs in
// with). poolSize bounds the server connections per database and user.
// Close stops it.
func Start(ctx context.Context, upstream string, poolSize int) (*Bouncer, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(upstream)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: upstream URL: %w", err)
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "5432"
	}
	usr := u.User.Username()
	pass, _ := u.User.Password()
	dir, err := os.MkdirTemp("", "tokenguard-pgbouncer-")
	if err != nil {
		return nil, err
	}
	// Readable by the unprivileged user PgBouncer runs as under root.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		b, err := start(ctx, bin, dir, host, port, usr, pass, poolSize)
		if err == nil || attempt == 3 {
			if err != nil {
				_ = os.RemoveAll(dir)
			}
			return b, err
		}
	}
}

func start(ctx context.Context, bin, dir, host, port, usr, pass string, poolSize int) (*Bouncer, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	listen := l.Addr().(*net.TCPAddr).Port
	l.Close()
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
admin_users = %s
pool_mode = transaction
default_pool_size = %d
max_client_conn = 2000
max_db_connections = 0
ignore_startup_parameters = extra_float_digits,search_path
server_reset_query =
server_check_delay = 0
log_connections = 0
log_disconnections = 0
`, host, port, listen, filepath.Join(dir, "users.txt"), usr, max(poolSize, 1))
	users := fmt.Sprintf("%q %q\n", usr, pass)
	if err := os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(ini), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "users.txt"), []byte(users), 0o644); err != nil {
		return nil, err
	}
	args := []string{filepath.Join(dir, "pgbouncer.ini")}
	if os.Geteuid() == 0 {
		// PgBouncer refuses to run as root.
		name, err := unprivileged()
		if err != nil {
			return nil, err
		}
		args = append([]string{"-u", name}, args...)
	}
	b := &Bouncer{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(listen)), dir: dir, done: make(chan struct{})}
	lifeline, owner, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	b.cmd = exec.Command("/bin/sh", append([]string{"-c", supervisor, "pgbouncer-supervisor", bin}, args...)...)
	b.cmd.Stdin = lifeline
	b.cmd.Stdout, b.cmd.Stderr = b, b
	b.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := b.cmd.Start(); err != nil {
		lifeline.Close()
		owner.Close()
		return nil, fmt.Errorf("start pgbouncer: %w", err)
	}
	lifeline.Close()
	b.owner = owner
	go func() { _ = b.cmd.Wait(); close(b.done) }()
	if err := b.await(ctx, usr); err != nil {
		b.stop()
		return nil, err
	}
	return b, nil
}

// Write collects PgBouncer's log, for errors.
func (b *Bouncer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.log.Len() < 1<<20 {
		b.log.Write(p)
	}
	return len(p), nil
}

func (b *Bouncer) logTail() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	lines := strings.Split(strings.TrimSpace(b.log.String()), "\n")
	return strings.Join(lines[max(0, len(lines)-5):], "\n")
}

// await waits until PgBouncer answers on its admin console.
func (b *Bouncer) await(ctx context.Context, usr string) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := pgx.Connect(ctx, fmt.Sprintf("postgres://%s@%s/pgbouncer?sslmode=disable&default_query_exec_mode=simple_protocol", url.PathEscape(usr), b.Addr))
		if err == nil {
			c.Close(ctx)
			return nil
		}
		select {
		case <-b.done:
			return fmt.Errorf("pgbouncer exited: %s", b.logTail())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgbouncer did not answer on %s: %v: %s", b.Addr, err, b.logTail())
		}
	}
}

// URL is dbURL (a URL of the upstream server) through the pooler: same
// database, user and password, PgBouncer's address, and pgx told to use no
// prepared statement across transactions (ExecMode).
func (b *Bouncer) URL(dbURL string) (string, error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", err
	}
	u.Host = b.Addr
	q := u.Query()
	k, v, _ := strings.Cut(ExecMode, "=")
	q.Set(k, v)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// Close stops PgBouncer and removes its files.
func (b *Bouncer) Close() {
	if b == nil {
		return
	}
	b.stop()
	_ = os.RemoveAll(b.dir)
}

func (b *Bouncer) stop() {
	b.owner.Close()
	select {
	case <-b.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL)
		<-b.done
	}
}

func unprivileged() (string, error) {
	for _, name := range []string{"postgres", "nobody"} {
		if u, err := user.Lookup(name); err == nil && u.Uid != "0" {
			return name, nil
		}
	}
	return "", errors.New("running as root, which pgbouncer refuses, and there is no user postgres or nobody to run it as")
}

// Transactions is how many transactions PgBouncer has pooled for the
// database named db (SHOW STATS, total_xact_count).
func (b *Bouncer) Transactions(ctx context.Context, usr, db string) (int64, error) {
	c, err := pgx.Connect(ctx, fmt.Sprintf("postgres://%s@%s/pgbouncer?sslmode=disable&default_query_exec_mode=simple_protocol", url.PathEscape(usr), b.Addr))
	if err != nil {
		return 0, err
	}
	defer c.Close(ctx)
	rows, err := c.Query(ctx, "SHOW STATS")
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var n int64
	for rows.Next() {
		// The simple protocol answers in text.
		vals := rows.RawValues()
		var name string
		var count int64
		for i, f := range rows.FieldDescriptions() {
			switch f.Name {
			case "database":
				name = string(vals[i])
			case "total_xact_count":
				count, _ = strconv.ParseInt(string(vals[i]), 10, 64)
			}
		}
		if name == db {
			n += count
		}
	}
	return n, rows.Err()
}
