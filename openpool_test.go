package tokenguard_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokenguard/tokenguard/internal/sandbox"
)

// pgxProgram is an application on pgx without GORM: its own pgxpool.Pool
// of POOL connections, its own table, and tokenguard through OpenPool. It
// prints "ready" once Run has made the cache live (and, with GRANTS, the
// grants are imported as expired tokens), waits for a line on stdin,
// asks for every connection's token at once and prints what happened as
// JSON.
const pgxProgram = `package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard"
)

func main() {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	size, _ := strconv.Atoi(os.Getenv("POOL"))
	cfg.MaxConns = int32(size)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS app_orders (id bigint PRIMARY KEY)"); err != nil {
		log.Fatal(err)
	}
	db, err := tokenguard.OpenPool(pool)
	if err != nil {
		log.Fatal(err)
	}
	if err := tokenguard.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	tokens, err := tokenguard.New(db, &oauth2.Config{
		ClientID:     os.Getenv("CLIENT_ID"),
		ClientSecret: os.Getenv("CLIENT_SECRET"),
		Endpoint:     oauth2.Endpoint{TokenURL: os.Getenv("TOKEN_URL"), AuthStyle: oauth2.AuthStyleInHeader},
	})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	go func() { _ = tokens.Run(runCtx) }()
	readyCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := tokens.WaitReady(readyCtx); err != nil {
		log.Fatal("WaitReady: ", err)
	}
	n, _ := strconv.Atoi(os.Getenv("CONNECTIONS"))
	if file := os.Getenv("GRANTS"); file != "" {
		raw, err := os.ReadFile(file)
		if err != nil {
			log.Fatal(err)
		}
		var grants []oauth2.Token
		if err := json.Unmarshal(raw, &grants); err != nil {
			log.Fatal(err)
		}
		for i := range grants {
			grants[i].Expiry = time.Now().Add(-time.Minute)
			if err := tokens.Import(ctx, fmt.Sprint("c", i), &grants[i]); err != nil {
				log.Fatal(err)
			}
		}
	}
	fmt.Println("ready")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')

	var (
		mu     sync.Mutex
		failed int
		first  string
		wg     sync.WaitGroup
	)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			callCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			if _, err := tokens.Token(callCtx, fmt.Sprint("c", i)); err != nil {
				mu.Lock()
				failed++
				if first == "" {
					first = err.Error()
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	stop()
	_ = tokens.Close(ctx)
	_ = json.NewEncoder(os.Stdout).Encode(map[string]any{"failed": failed, "first_error": first})
}
`

// An application on pgxpool, with no GORM of its own, embeds the library
// through OpenPool: three processes, each on a pool of 4, run Run (each
// listening, seen in pg_stat_activity, on a connection made from its
// pool's configuration), then ask at once for 200 connections that all
// expired; every call succeeds and each connection is refreshed once
// fleet-wide, none twice.
func TestOpenPoolThreeProcessesMassExpiry(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs programs")
	}
	const connections, poolSize = 200, 4
	w := newWorld(t, sandbox.Options{})
	_, bin := buildOutsideWith(t, outsideModuleWith(t, pgxProgram, nil, "github.com/jackc/pgx/v5"))
	grants := make([]any, connections)
	for i := range grants {
		grants[i] = w.grant(t)
	}
	raw, _ := json.Marshal(grants)
	file := filepath.Join(t.TempDir(), "grants.json")
	if err := os.WriteFile(file, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	w.provider.SetRefreshLatency(500 * time.Millisecond)
	before := w.provider.Stats()

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env := append(os.Environ(), "DATABASE_URL="+w.url, "POOL="+fmt.Sprint(poolSize), "CONNECTIONS="+fmt.Sprint(connections),
		"TOKEN_URL="+w.oauth.Endpoint.TokenURL, "CLIENT_ID="+w.oauth.ClientID, "CLIENT_SECRET="+w.oauth.ClientSecret)
	var procs []*pgxProcess
	for i := range 3 {
		e := env
		if i == 0 {
			e = append(e, "GRANTS="+file) // the first imports; the others start once it has
		}
		procs = append(procs, startPgxProcess(ctx, t, bin, e))
	}
	if n := listeners(t, w.url); n != 3 {
		t.Fatalf("%d listening connections in pg_stat_activity, want one per process (3)", n)
	}
	for _, p := range procs {
		_, _ = io.WriteString(p.stdin, "go\n")
	}
	for i, p := range procs {
		got := p.result(t)
		if got.Failed != 0 {
			t.Fatalf("process %d: %d of %d calls failed, first: %s", i, got.Failed, connections, got.FirstError)
		}
	}
	after := w.provider.Stats()
	t.Logf("3 processes × %d stale connections, pools of %d, provider 500 ms: %d refreshes, %d reuse",
		connections, poolSize, after.Refreshes-before.Refreshes, after.RefreshReuse-before.RefreshReuse)
	if n := after.Refreshes - before.Refreshes; n != connections {
		t.Errorf("provider saw %d refreshes, want one per connection (%d)", n, connections)
	}
	if n := after.RefreshReuse - before.RefreshReuse; n != 0 {
		t.Errorf("provider saw %d reuses", n)
	}
}

// pgxProcess is a running pgxProgram that has printed "ready".
type pgxProcess struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	out    *bufio.Reader
	stderr *strings.Builder
}

func startPgxProcess(ctx context.Context, t *testing.T, bin string, env []string) *pgxProcess {
	t.Helper()
	p := &pgxProcess{cmd: exec.CommandContext(ctx, bin), stderr: &strings.Builder{}}
	p.cmd.Env, p.cmd.Stderr = env, p.stderr
	var err error
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() })
	p.out = bufio.NewReader(stdout)
	if line, err := p.out.ReadString('\n'); line != "ready\n" {
		t.Fatalf("the program printed %q (%v), want ready\nstderr:\n%s", line, err, p.stderr.String())
	}
	return p
}

type pgxResult struct {
	Failed     int    `json:"failed"`
	FirstError string `json:"first_error"`
}

func (p *pgxProcess) result(t *testing.T) pgxResult {
	t.Helper()
	var got pgxResult
	if err := json.NewDecoder(p.out).Decode(&got); err != nil {
		t.Fatalf("the program's result: %v\nstderr:\n%s", err, p.stderr.String())
	}
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("the program failed: %v\nstderr:\n%s", err, p.stderr.String())
	}
	return got
}

// listeners counts tokenguard's listening connections to url's database.
func listeners(t *testing.T, url string) int {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = 'tokenguard-listener'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
