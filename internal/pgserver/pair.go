//go:build unix

package pgserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Pair is a throw-away primary and a streaming standby on this machine,
// for failover tests: Failover cuts the replication link and stops the
// primary at once (pg_ctl stop -m immediate: no shutdown checkpoint, no
// last WAL sent), as a primary isolated and then lost; it promotes the
// standby and rebuilds the old primary as the new standby (a fresh
// pg_basebackup -R). Each node lives in a directory of its own that the
// sweep of the next StartCluster or StartPair removes if this process dies
// without Close.
type Pair struct {
	// Sync: commits wait for the standby (synchronous_standby_names =
	// '*'); else the standby is asynchronous.
	Sync bool

	bin   string
	cred  *syscall.Credential
	mu    sync.Mutex
	nodes [2]*pairNode
	prim  int   // index of the primary in nodes
	link  *link // the standby's replication connection goes through it
}

type pairNode struct {
	dir     string
	port    int
	lock    *os.File
	started bool // once: its port is in URLs handed out
}

func (n *pairNode) data() string { return filepath.Join(n.dir, "data") }

func (n *pairNode) url(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", n.port, db)
}

// StartPair makes a primary with initdb, a standby from it with
// pg_basebackup -R, starts both and waits until the standby streams (and,
// with sync, until commits wait for it).
func StartPair(ctx context.Context, sync bool) (*Pair, error) {
	p, err := startPrimary(ctx, sync)
	if err != nil {
		return nil, err
	}
	if p.link, err = newLink(); err != nil {
		p.Close()
		return nil, err
	}
	if p.nodes[1], err = p.newNode(os.TempDir()); err != nil {
		p.Close()
		return nil, err
	}
	if err := p.rebuild(ctx, 1); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// StartLone makes a server as StartPair makes its primary, with the same
// settings, and no standby: what a pair is compared with. Close stops it
// and removes its directory.
func StartLone(ctx context.Context) (*Server, error) {
	p, err := startPrimary(ctx, false)
	if err != nil {
		return nil, err
	}
	return &Server{URL: p.nodes[0].url("postgres"), Source: "initdb", close: p.Close}, nil
}

// PairBinaries says whether StartPair and StartLone can run here: initdb,
// postgres, pg_ctl and pg_basebackup in one directory.
func PairBinaries() error {
	_, err := pairBinaries()
	return err
}

func pairBinaries() (string, error) {
	bin, err := findBinaries()
	if err != nil {
		return "", err
	}
	for _, tool := range []string{"pg_ctl", "pg_basebackup"} {
		if !isExecutable(filepath.Join(bin, tool)) {
			return "", fmt.Errorf("no %s beside initdb in %s", tool, bin)
		}
	}
	return bin, nil
}

// startPrimary makes nodes[0] with initdb and starts it.
func startPrimary(ctx context.Context, sync bool) (*Pair, error) {
	bin, err := pairBinaries()
	if err != nil {
		return nil, err
	}
	cred, err := clusterUser()
	if err != nil {
		return nil, err
	}
	base := os.TempDir()
	sweep(base)
	p := &Pair{Sync: sync, bin: bin, cred: cred}
	prim, err := p.newNode(base)
	if err != nil {
		return nil, err
	}
	p.nodes[0] = prim
	if err := p.run(ctx, "initdb", "-D", prim.data(), "-U", "postgres", "--auth=trust", "--no-locale", "-E", "UTF8", "--no-sync"); err != nil {
		p.Close()
		return nil, err
	}
	// Durability is the point here: commits are flushed as in production
	// (synchronous_commit on); only fsync is off, as nothing here
	// outlives the run and an immediate stop keeps the OS page cache.
	conf := "wal_level = replica\nmax_wal_senders = 10\nhot_standby = on\nfsync = off\nmax_connections = 200\n" +
		"wal_keep_size = '256MB'\nwal_sender_timeout = '5s'\nwal_receiver_status_interval = '1s'\nwal_retrieve_retry_interval = '100ms'\n"
	if err := appendFile(filepath.Join(prim.data(), "postgresql.conf"), conf); err != nil {
		p.Close()
		return nil, err
	}
	if err := p.start(ctx, prim); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

func (p *Pair) newNode(base string) (*pairNode, error) {
	dir, err := os.MkdirTemp(base, dirPrefix)
	if err != nil {
		return nil, err
	}
	lock, err := lockOwner(dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if p.cred != nil {
		if err := os.Chown(dir, int(p.cred.Uid), int(p.cred.Gid)); err != nil {
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
	return &pairNode{dir: dir, port: port, lock: lock}, nil
}

// URL is a DSN naming both nodes with target_session_attrs=read-write:
// clients connect to whichever is the primary, as after a failover.
func (p *Pair) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&target_session_attrs=read-write",
		p.nodes[0].port, p.nodes[1].port, db)
}

// PrimaryURL is the admin URL of the current primary.
func (p *Pair) PrimaryURL() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nodes[p.prim].url("postgres")
}

// StandbyURL is the admin URL of the current standby (read-only).
func (p *Pair) StandbyURL() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nodes[1-p.prim].url("postgres")
}

// FailoverTimes says how a failover went.
type FailoverTimes struct {
	Promoted time.Duration // primary stopped until the standby accepted writes
	Rebuilt  time.Duration // until the old primary streamed again as a standby (sync: and commits waited for it)
}

// Failover cuts the primary off its standby, lets it run isolated for a
// while, stops it immediately, then calls beforePromote (which
// may read the standby as it was left, the last thing the old primary
// sent), promotes the standby, and rebuilds the old primary as the new
// standby. With Sync, the promoted node runs without a synchronous
// standby until the new one streams, as Patroni does without
// synchronous_mode_strict: a lone primary whose commits waited for nobody
// would block every write.
func (p *Pair) Failover(ctx context.Context, isolated time.Duration, beforePromote func(ctx context.Context, standbyURL string)) (FailoverTimes, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ft FailoverTimes
	old, next := p.nodes[p.prim], p.nodes[1-p.prim]
	start := time.Now()
	// Nothing more reaches the standby: WAL the primary has not sent yet
	// is lost with it. With a synchronous standby no commit returned
	// without it; with an asynchronous one, commits made from here until
	// the primary stops are acknowledged and lost.
	p.link.cut()
	time.Sleep(isolated)
	if err := p.run(ctx, "pg_ctl", "stop", "-D", old.data(), "-m", "immediate", "-w"); err != nil {
		return ft, err
	}
	if beforePromote != nil {
		beforePromote(ctx, next.url("postgres"))
	}
	// Copied from the old primary by pg_basebackup; promoted with it, the
	// node would wait for a standby that is not there yet.
	if err := dropSetting(filepath.Join(next.data(), "postgresql.auto.conf"), "synchronous_standby_names"); err != nil {
		return ft, err
	}
	if err := p.run(ctx, "pg_ctl", "reload", "-D", next.data()); err != nil {
		return ft, err
	}
	if err := p.run(ctx, "pg_ctl", "promote", "-D", next.data(), "-w"); err != nil {
		return ft, err
	}
	if err := awaitWritable(ctx, next.url("postgres")); err != nil {
		return ft, err
	}
	ft.Promoted = time.Since(start)
	p.prim = 1 - p.prim
	if err := p.rebuild(ctx, 1-p.prim); err != nil {
		return ft, err
	}
	ft.Rebuilt = time.Since(start)
	return ft, nil
}

// rebuild makes nodes[i] a fresh standby of the primary and waits until it
// streams; with Sync it then makes commits wait for it.
func (p *Pair) rebuild(ctx context.Context, i int) error {
	prim, n := p.nodes[p.prim], p.nodes[i]
	if err := os.RemoveAll(n.data()); err != nil {
		return err
	}
	if err := p.run(ctx, "pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(prim.port), "-U", "postgres",
		"-D", n.data(), "-R", "-X", "stream", "--no-sync", "-c", "fast"); err != nil {
		return err
	}
	// Replication goes through the link, which Failover can cut.
	p.link.connect(prim.port)
	auto := filepath.Join(n.data(), "postgresql.auto.conf")
	conf, err := os.ReadFile(auto)
	if err != nil {
		return err
	}
	conf = []byte(strings.ReplaceAll(string(conf), "port="+strconv.Itoa(prim.port), "port="+strconv.Itoa(p.link.port())))
	if err := os.WriteFile(auto, conf, 0o600); err != nil {
		return err
	}
	if err := p.start(ctx, n); err != nil {
		return err
	}
	want := "async"
	if p.Sync {
		want = "sync"
		if err := execSQL(ctx, prim.url("postgres"), "ALTER SYSTEM SET synchronous_standby_names = '*'", "SELECT pg_reload_conf()"); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(time.Minute)
	for {
		var state string
		err := query(ctx, prim.url("postgres"), func(c *pgx.Conn) error {
			return c.QueryRow(ctx, "SELECT coalesce(max(sync_state), '') FROM pg_stat_replication WHERE state = 'streaming'").Scan(&state)
		})
		if err == nil && state == want {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("standby on port %d not streaming (%s) after a minute: %v, state %q", n.port, want, err, state)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// start runs postgres on n's data with pg_ctl, its socket and log in n's
// directory. A node's first start takes another free port if another
// process took its own since newNode found it free.
func (p *Pair) start(ctx context.Context, n *pairNode) error {
	for attempt := 1; ; attempt++ {
		opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1", n.port, n.dir)
		log := filepath.Join(n.dir, "postgres.log")
		err := p.run(ctx, "pg_ctl", "start", "-D", n.data(), "-l", log, "-w", "-t", "60", "-o", opts)
		if err == nil {
			err = awaitReady(ctx, n.url("postgres"), n.dir)
		}
		if err == nil {
			n.started = true
			return nil
		}
		out, _ := os.ReadFile(log)
		if n.started || attempt == 3 || !bytes.Contains(out, []byte("Address already in use")) {
			return fmt.Errorf("%w; postgres.log: %s", err, lastLines(out, 5))
		}
		if n.port, err = freePort(); err != nil {
			return err
		}
	}
}

// Close stops both nodes and removes their directories.
func (p *Pair) Close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.link != nil {
		p.link.close()
	}
	for _, n := range p.nodes {
		if n == nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(n.data(), "postmaster.pid")); err == nil {
			_ = p.run(context.Background(), "pg_ctl", "stop", "-D", n.data(), "-m", "immediate", "-w")
		}
		n.lock.Close()
		_ = os.RemoveAll(n.dir)
	}
}

func (p *Pair) run(ctx context.Context, tool string, args ...string) error {
	cmd := command(p.cred, filepath.Join(p.bin, tool), args...)
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		if cmd.Process != nil {
			_ = cmd.Process.Kill()
		}
		<-done
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", tool, strings.Join(args, " "), err, lastLines(out, 5))
	}
	return nil
}

func awaitWritable(ctx context.Context, u string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		var recovering bool
		err := query(ctx, u, func(c *pgx.Conn) error {
			return c.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&recovering)
		})
		if err == nil && !recovering {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("promoted server does not accept writes: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func query(ctx context.Context, u string, fn func(*pgx.Conn) error) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, u)
	if err != nil {
		return err
	}
	defer c.Close(context.WithoutCancel(ctx))
	return fn(c)
}

func execSQL(ctx context.Context, u string, stmts ...string) error {
	return query(ctx, u, func(c *pgx.Conn) error {
		for _, s := range stmts {
			if _, err := c.Exec(ctx, s); err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
		}
		return nil
	})
}

func appendFile(path, s string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(s)
	return errors.Join(err, f.Close())
}

// dropSetting removes name's lines from a postgresql.auto.conf.
func dropSetting(path, name string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var keep []string
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), name) {
			keep = append(keep, l)
		}
	}
	return os.WriteFile(path, []byte(strings.Join(keep, "\n")), 0o600)
}

// link forwards the standby's replication connection to the primary, and
// can be cut: its connections reset, unsent data dropped, new ones
// refused until it is connected again.
type link struct {
	ln     net.Listener
	mu     sync.Mutex
	target int // the primary's port; 0: cut
	conns  map[*net.TCPConn]bool
}

func newLink() (*link, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	l := &link{ln: ln, conns: map[*net.TCPConn]bool{}}
	go l.serve()
	return l, nil
}

func (l *link) port() int { return l.ln.Addr().(*net.TCPAddr).Port }

func (l *link) serve() {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		go l.pipe(c.(*net.TCPConn))
	}
}

func (l *link) pipe(in *net.TCPConn) {
	l.mu.Lock()
	target := l.target
	l.mu.Unlock()
	if target == 0 {
		_ = in.SetLinger(0)
		in.Close()
		return
	}
	c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(target))
	if err != nil {
		in.Close()
		return
	}
	out := c.(*net.TCPConn)
	l.mu.Lock()
	if l.target != target {
		l.mu.Unlock()
		in.Close()
		out.Close()
		return
	}
	l.conns[in], l.conns[out] = true, true
	l.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(out, in); done <- struct{}{} }()
	go func() { _, _ = io.Copy(in, out); done <- struct{}{} }()
	<-done
	l.mu.Lock()
	delete(l.conns, in)
	delete(l.conns, out)
	l.mu.Unlock()
	in.Close()
	out.Close()
}

func (l *link) connect(port int) {
	l.mu.Lock()
	l.target = port
	l.mu.Unlock()
}

func (l *link) cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.target = 0
	for c := range l.conns {
		_ = c.SetLinger(0) // reset: what is not sent yet is dropped
		c.Close()
		delete(l.conns, c)
	}
}

func (l *link) close() {
	l.cut()
	l.ln.Close()
}
