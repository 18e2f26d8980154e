package bench_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/testworld"
)

// The designs other systems ship for the refresh storm, written out in
// this package's tests so that BenchmarkRefreshStorm, BenchmarkTokenHot and
// the proactive sweep measure them beside tokenguard, in the same run,
// against the same Postgres and the same strict provider (docs/benchmarks.md).
// Each follows its source (cited beside it) in what it asks of the
// database, Redis and the provider, and in how its callers wait; none of
// their code is copied. Each runs in a database of its own, so its locks
// (advisory locks are per database) and rows never meet tokenguard's.

// peer is one design with stacks processes sharing one connection.
type peer interface {
	// call is one caller of process i asking for a valid access token.
	call(ctx context.Context, i int) error
	// expire moves the design's clock just past the point at which it
	// refreshes the stored token, as at a real expiry.
	expire(tb testing.TB)
	// watch starts counting the database connections its processes hold;
	// peak stops and returns the most held at once.
	watch() (peak func() int64)
	// rest closes the connections its pools keep idle, so that the
	// benchmark fits a stock Postgres (max_connections 100): each design
	// holds up to 60 at a storm. Its next storm opens them anew.
	rest()
}

// peerNames are the designs, in the order the benchmarks run them.
var peerNames = []string{"nango", "grafana", "coder", "seed"}

// newPeer builds the named design for the world's provider.
func newPeer(tb testing.TB, w *testworld.World, name string, stacks int) peer {
	tb.Helper()
	switch name {
	case "nango":
		return newNangoPeer(tb, w, stacks)
	case "grafana":
		return newGrafanaPeer(tb, w, stacks)
	case "coder":
		return newCoderPeer(tb, w, stacks)
	case "seed":
		return newSeedPeer(tb, w, stacks)
	}
	tb.Fatalf("no peer %q", name)
	return nil
}

// gauge counts what is held at once, and the most at once since reset.
type gauge struct{ cur, peak atomic.Int64 }

func (g *gauge) enter() {
	n := g.cur.Add(1)
	for {
		p := g.peak.Load()
		if n <= p || g.peak.CompareAndSwap(p, n) {
			return
		}
	}
}

func (g *gauge) leave() { g.cur.Add(-1) }

// watch is peer.watch for designs whose pools count into g.
func (g *gauge) watch() func() int64 {
	g.peak.Store(g.cur.Load())
	return g.peak.Load
}

// countedPool opens a pgx pool of size conns whose acquired connections g
// counts.
func countedPool(tb testing.TB, url string, conns int32, g *gauge) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		tb.Fatal(err)
	}
	cfg.MaxConns = conns
	cfg.PrepareConn = func(context.Context, *pgx.Conn) (bool, error) { g.enter(); return true, nil }
	cfg.AfterRelease = func(*pgx.Conn) bool { g.leave(); return true }
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// resetPools closes the idle connections of pgx pools.
func resetPools(pools ...*pgxpool.Pool) {
	for _, p := range pools {
		p.Reset()
	}
}

// peerGrant runs the authorization-code flow for a peer's own grant.
func peerGrant(tb testing.TB, w *testworld.World) *oauth2.Token {
	tb.Helper()
	tok, err := sandbox.Grant(context.Background(), w.OAuth)
	if err != nil {
		tb.Fatal(err)
	}
	return tok
}

// refreshWith redeems refreshToken the way the Go peers do, through
// x/oauth2's token source (a token with only a refresh token is invalid, so
// the source goes straight to the token endpoint).
func refreshWith(ctx context.Context, cfg *oauth2.Config, refreshToken string) (*oauth2.Token, error) {
	return cfg.TokenSource(ctx, &oauth2.Token{RefreshToken: refreshToken}).Token()
}

// peerClock is a design's clock: the wall clock until pass stops it at a
// token's due time. Stopped, the storm's callers all see the instant the
// token fell due, however long the design keeps them waiting, so the token
// the storm stores is never due before the storm ends.
type peerClock struct {
	at   atomic.Int64 // UnixNano; 0: the wall clock
	next time.Time    // the earliest next pass
}

func (c *peerClock) Now() time.Time {
	if at := c.at.Load(); at != 0 {
		return time.Unix(0, at)
	}
	return time.Now()
}

// pass stops the clock just past t, the point at which the stored token
// falls due. The provider states lifetimes in whole seconds, so a token
// issued less than a second after the previous one may expire before it:
// pass comes at least 1.5 s after the previous pass or grant (a storm's
// refresh comes early in it), and 100 ms after the caller's last write, as
// stormClock.expire does.
func (c *peerClock) pass(t time.Time) {
	time.Sleep(max(100*time.Millisecond, time.Until(c.next)))
	c.issued()
	c.at.Store(t.Add(time.Millisecond).UnixNano())
}

// issued says a token was stored now.
func (c *peerClock) issued() { c.next = time.Now().Add(1500 * time.Millisecond) }

// peerStorm is what the storm benchmark collects about one design.
type peerStorm struct {
	name                     string
	p                        peer
	waits                    []time.Duration
	peaks                    []int64
	refreshes, reuse, errors int64
}

func (s *peerStorm) clear() {
	s.waits, s.peaks, s.refreshes, s.reuse, s.errors = s.waits[:0], s.peaks[:0], 0, 0, 0
}

// run is one storm of the design: the same fan-out as tokenguard's, a
// caller's error counted, not fatal (some designs give up under load).
func (s *peerStorm) run(b *testing.B, w *testworld.World, stacks, goroutines int) {
	s.p.expire(b)
	peak := s.p.watch()
	before := w.Provider.Stats()
	var errs atomic.Int64
	s.waits = storm(b, stacks, goroutines, s.waits, func(i int) error {
		if err := s.p.call(context.Background(), i); err != nil {
			errs.Add(1)
		}
		return nil
	})
	after := w.Provider.Stats()
	s.refreshes += after.Refreshes - before.Refreshes
	s.reuse += after.RefreshReuse - before.RefreshReuse
	s.errors += errs.Load()
	s.peaks = append(s.peaks, peak())
	s.p.rest()
}

func (s *peerStorm) report(b *testing.B) {
	slices.Sort(s.waits)
	b.ReportMetric(ms(s.waits[len(s.waits)/2]), s.name+"-p50-ms")
	b.ReportMetric(ms(s.waits[len(s.waits)*99/100]), s.name+"-p99-ms")
	b.ReportMetric(float64(slices.Max(s.peaks)), s.name+"-db-conns-peak")
	b.ReportMetric(float64(s.refreshes)/float64(b.N), s.name+"-refreshes/op")
	b.ReportMetric(float64(s.reuse)/float64(b.N), s.name+"-reuse/op")
	b.ReportMetric(float64(s.errors)/float64(b.N), s.name+"-errors/op")
}

// TestPeersRefreshOncePerExpiry: before their figures count, every peer
// design refreshes exactly once per expiry, without reuse and without a
// failed call (but for Grafana's giving up after 5 tries, which is its
// design and which the benchmark counts), in storms of the benchmark's
// shape (3 processes, fewer callers).
func TestPeersRefreshOncePerExpiry(t *testing.T) {
	w := testworld.New(t, time.Hour)
	for _, name := range peerNames {
		t.Run(name, func(t *testing.T) {
			p := newPeer(t, w, name, 3)
			for k := range 2 {
				p.expire(t)
				before := w.Provider.Stats()
				var wg sync.WaitGroup
				var failed atomic.Int64
				start := make(chan struct{})
				for i := range 3 {
					for range 20 {
						wg.Go(func() {
							<-start
							err := p.call(context.Background(), i)
							switch {
							case errors.Is(err, errGrafanaRetriesExhausted):
								t.Log(err) // the design gives up under contention: reported, not wrong
							case err != nil:
								failed.Add(1)
								t.Error(err)
							}
						})
					}
				}
				close(start)
				wg.Wait()
				after := w.Provider.Stats()
				if n, r := after.Refreshes-before.Refreshes, after.RefreshReuse-before.RefreshReuse; n != 1 || r != 0 || failed.Load() != 0 {
					t.Fatalf("storm %d: %d refreshes, %d reuse, %d failed calls", k, n, r, failed.Load())
				}
			}
			// Fresh: no refresh at all.
			before := w.Provider.Stats()
			for i := range 3 {
				if err := p.call(context.Background(), i); err != nil {
					t.Fatal(err)
				}
			}
			if n := w.Provider.Stats().Refreshes - before.Refreshes; n != 0 {
				t.Fatalf("fresh token: %d refreshes", n)
			}
		})
	}
}

// redisAddr is where the Nango-style peer finds Redis.
func redisAddr() string {
	if a := os.Getenv("TEST_REDIS_ADDR"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}
