package tokenguard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/testdb"
)

// poolProgram embeds the library as an application does: its own
// *gorm.DB with a small pool (POOL connections), the grants in GRANTS
// imported as expired tokens, then Token for all of them at once. It
// prints what happened as JSON.
const poolProgram = `package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/oauth2"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/tokenguard/tokenguard"
)

func main() {
	ctx := context.Background()
	pool, _ := strconv.Atoi(os.Getenv("POOL"))
	db, err := gorm.Open(postgres.Open(os.Getenv("DATABASE_URL")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		log.Fatal(err)
	}
	sqlDB.SetMaxOpenConns(pool)
	if err := tokenguard.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	cfg := &oauth2.Config{
		ClientID:     os.Getenv("CLIENT_ID"),
		ClientSecret: os.Getenv("CLIENT_SECRET"),
		Endpoint:     oauth2.Endpoint{TokenURL: os.Getenv("TOKEN_URL"), AuthStyle: oauth2.AuthStyleInHeader},
	}
	tokens, err := tokenguard.New(db, cfg)
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	go func() { _ = tokens.Run(runCtx) }()

	raw, err := os.ReadFile(os.Getenv("GRANTS"))
	if err != nil {
		log.Fatal(err)
	}
	var grants []oauth2.Token
	if err := json.Unmarshal(raw, &grants); err != nil {
		log.Fatal(err)
	}
	for i := range grants {
		grants[i].Expiry = time.Now().Add(-time.Minute) // stale: every one is refreshed
		if err := tokens.Import(ctx, fmt.Sprint("c", i), &grants[i]); err != nil {
			log.Fatal(err)
		}
	}
	var (
		mu     sync.Mutex
		failed int
		first  string
		wg     sync.WaitGroup
	)
	start := time.Now()
	for i := range grants {
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
	took := time.Since(start)
	stop()
	_ = tokens.Close(ctx)
	_ = json.NewEncoder(os.Stdout).Encode(map[string]any{"failed": failed, "seconds": took.Seconds(), "first_error": first})
}
`

// The table of the critical-path issue, re-run by a program outside the
// module that embeds the library with a small pool: N stale connections
// asked for at once, through a pool smaller than N, at a provider that
// takes its time. A refresh holds no database connection while the
// provider answers and never waits for a second one while it holds
// one, so every row succeeds, each connection refreshed once, with no
// reuse. (With a connection held across the call, and the lease written
// on a second one, the last three rows starved: every pool connection
// was a lock holder waiting for another.)
func TestSmallPoolsManyStaleConnections(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a program")
	}
	w := newWorld(t, sandbox.Options{})
	_, bin := buildOutside(t, poolProgram)
	for _, row := range []struct {
		pool, connections int
		latency           time.Duration
	}{
		{16, 16, 300 * time.Millisecond},
		{4, 8, 300 * time.Millisecond},
		{10, 40, 300 * time.Millisecond},
		{2, 16, 300 * time.Millisecond},
		{1, 16, time.Second},
		{2, 200, time.Second},
	} {
		t.Run(fmt.Sprintf("pool %d, %d connections, provider %v", row.pool, row.connections, row.latency), func(t *testing.T) {
			grants := make([]any, row.connections)
			for i := range grants {
				grants[i] = w.grant(t)
			}
			raw, _ := json.Marshal(grants)
			file := filepath.Join(t.TempDir(), "grants.json")
			if err := os.WriteFile(file, raw, 0o600); err != nil {
				t.Fatal(err)
			}
			w.provider.SetRefreshLatency(row.latency)
			defer w.provider.SetRefreshLatency(0)
			before := w.provider.Stats()

			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			run := exec.CommandContext(ctx, bin)
			run.Env = append(os.Environ(), "DATABASE_URL="+testdb.NewEmpty(t), "POOL="+fmt.Sprint(row.pool),
				"TOKEN_URL="+w.oauth.Endpoint.TokenURL, "CLIENT_ID="+w.oauth.ClientID,
				"CLIENT_SECRET="+w.oauth.ClientSecret, "GRANTS="+file)
			var stderr strings.Builder
			run.Stderr = &stderr
			out, err := run.Output()
			if err != nil {
				t.Fatalf("the program failed: %v\n%s", err, stderr.String())
			}
			var got struct {
				Failed     int     `json:"failed"`
				Seconds    float64 `json:"seconds"`
				FirstError string  `json:"first_error"`
			}
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("output %q: %v", out, err)
			}
			after := w.provider.Stats()
			t.Logf("%d of %d failed in %.1f s; provider: %d refreshes, %d reuse", got.Failed, row.connections, got.Seconds,
				after.Refreshes-before.Refreshes, after.RefreshReuse-before.RefreshReuse)
			if got.Failed != 0 {
				t.Fatalf("%d of %d calls failed, first: %s", got.Failed, row.connections, got.FirstError)
			}
			if n := after.Refreshes - before.Refreshes; n != int64(row.connections) {
				t.Errorf("provider saw %d refreshes, want one per connection (%d)", n, row.connections)
			}
			if n := after.RefreshReuse - before.RefreshReuse; n != 0 {
				t.Errorf("provider saw %d reuses", n)
			}
		})
	}
}
