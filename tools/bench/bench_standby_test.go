//go:build unix

package bench_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/internal/pgserver"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/testdb"
	"github.com/tokenguard/tokenguard/internal/testworld"
)

// standbyServers are the admin URLs of BenchmarkRefreshStormStandby's
// clusters.
type standbyServers struct{ lone, primary string }

// standbyClusters makes them once per test binary (go test calls a
// benchmark with b.N = 1 before the b.N asked for) and stops them when the
// package's benchmarks have run.
var standbyClusters = sync.OnceValues(func() (standbyServers, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	lone, err := pgserver.StartLone(ctx)
	if err != nil {
		return standbyServers{}, fmt.Errorf("lone server: %w", err)
	}
	pair, err := pgserver.StartPair(ctx, true)
	if err != nil {
		lone.Close()
		return standbyServers{}, fmt.Errorf("primary and synchronous standby: %w", err)
	}
	testdb.AtExit(func() { pair.Close(); lone.Close() })
	return standbyServers{lone: lone.URL, primary: pair.PrimaryURL()}, nil
})

// standbySide is one cluster's storms.
type standbySide struct {
	name, want       string // metric prefix; the synchronous_commit level tokenguard must pick there
	f                *stormFleet
	waits, commits   []time.Duration
	refreshes, reuse int64
	p50, p99         float64
}

// BenchmarkRefreshStormStandby: what a synchronous standby costs the
// refresh storm. BenchmarkRefreshStorm's storm (3 stacks x 200 callers,
// the strict provider answering in 20 ms) runs on two throw-away clusters
// made alike on this machine (pgserver: initdb, fsync off): a lone server,
// and a primary whose commits wait for a streaming standby. Each side's
// token writes commit at the level tokenguard picks for its cluster: on
// alone, remote_apply with the synchronous standby. One op is one storm on
// each side, the order alternating, so that both meet the same machine;
// p50 and p99 are over every caller of the run. After each storm, 20
// one-row commits at the side's level time what a commit alone waits for.
func BenchmarkRefreshStormStandby(b *testing.B) {
	quiet(b)
	if testing.Short() {
		b.Skip("starts postgres")
	}
	if err := pgserver.PairBinaries(); err != nil {
		if os.Getenv("CI") == "true" {
			b.Fatalf("a primary and a synchronous standby need initdb and pg_basebackup: %v", err)
		}
		b.Skipf("skipped: the standby's cost needs initdb and pg_basebackup (Debian: apt-get install postgresql): %v", err)
	}
	servers, err := standbyClusters()
	if err != nil {
		b.Fatal(err)
	}
	const (
		stacks     = 3
		goroutines = 200
		latency    = 20 * time.Millisecond
	)
	p, err := sandbox.New(sandbox.Options{AccessTokenLifespan: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	p.SetRefreshLatency(latency)
	lone := testworld.On(b, p, testdb.NewOn(b, servers.lone))
	standby := *lone // the same provider: the storms take turns
	standby.URL = testdb.NewOn(b, servers.primary)
	sides := []*standbySide{
		{name: "lone", want: "on", f: newStormFleet(b, lone, stacks, true)},
		{name: "standby", want: "remote_apply", f: newStormFleet(b, &standby, stacks, true)},
	}
	for _, s := range sides {
		if s.f.syncCommit != s.want {
			b.Fatalf("%s: token writes at synchronous_commit %q, want %q", s.name, s.f.syncCommit, s.want)
		}
	}

	b.ResetTimer()
	for i := -1; i < b.N; i++ { // op -1 warms the pools up and is not counted
		for k := range sides {
			s := sides[(i+1+k)%len(sides)]
			if i == 0 && k == 0 {
				for _, s := range sides {
					s.waits, s.commits, s.refreshes, s.reuse = s.waits[:0], s.commits[:0], 0, 0
				}
			}
			b.StopTimer()
			s.f.arm(b)
			before := p.Stats()
			b.StartTimer()
			s.waits = storm(b, stacks, goroutines, s.waits, s.f.call)
			b.StopTimer()
			after := p.Stats()
			s.refreshes += after.Refreshes - before.Refreshes
			s.reuse += after.RefreshReuse - before.RefreshReuse
			s.commits = timeCommits(b, s.f.seed.DB, s.f.syncCommit, 20, s.commits)
		}
	}
	for _, s := range sides {
		slices.Sort(s.waits)
		s.p50, s.p99 = ms(s.waits[len(s.waits)/2]), ms(s.waits[len(s.waits)*99/100])
		b.ReportMetric(s.p50, s.name+"-p50-ms")
		b.ReportMetric(s.p99, s.name+"-p99-ms")
		slices.Sort(s.commits)
		b.ReportMetric(ms(s.commits[len(s.commits)/2]), s.name+"-commit-ms")
		b.ReportMetric(float64(s.refreshes)/float64(b.N), s.name+"-refreshes/op")
		b.ReportMetric(float64(s.reuse)/float64(b.N), s.name+"-reuse/op")
	}
	l, sb := sides[0], sides[1]
	b.ReportMetric(sb.p50-l.p50, "added-p50-ms")
	b.ReportMetric(sb.p99-l.p99, "added-p99-ms")
	b.ReportMetric(sb.p50/l.p50, "p50-ratio")
	b.ReportMetric(sb.p99/l.p99, "p99-ratio")
	b.ReportMetric(float64(latency.Milliseconds()), "provider-latency-ms")
}

// timeCommits appends how long each of n one-row transactions at
// synchronous_commit level waited for its COMMIT: what a token write's
// commit waits for on that cluster, alone.
func timeCommits(b *testing.B, db *gorm.DB, level string, n int, waits []time.Duration) []time.Duration {
	if err := db.Exec("CREATE TABLE IF NOT EXISTS bench_commits (n int)").Error; err != nil {
		b.Fatal(err)
	}
	for range n {
		tx := db.Begin()
		if err := tx.Exec("SELECT set_config('synchronous_commit', ?, true)", level).Error; err != nil {
			b.Fatal(err)
		}
		if err := tx.Exec("INSERT INTO bench_commits VALUES (1)").Error; err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		if err := tx.Commit().Error; err != nil {
			b.Fatal(err)
		}
		waits = append(waits, time.Since(t0))
	}
	return waits
}
