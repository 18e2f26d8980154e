package bench_test

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/postgres"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/internal/testworld"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// BenchmarkConnectionTime: the sum of the time database connections are
// held per refresh (every read, lock transaction and lease release, from
// taking the pool connection to giving it back) in a listening process, at
// a provider answering in 20 ms and in 1 s. A refresh holds none while the
// provider answers, so the figure does not follow the provider's latency.
func BenchmarkConnectionTime(b *testing.B) {
	for _, latency := range []time.Duration{20 * time.Millisecond, time.Second} {
		b.Run(fmt.Sprintf("provider=%v", latency), func(b *testing.B) {
			quiet(b)
			w := testworld.New(b, time.Hour)
			seed := w.Stack(b, usecase.Options{})
			w.Connect(b, seed)
			db, err := postgres.Open(context.Background(), w.URL, postgres.Pool{MaxOpenConns: 4}, nil)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = postgres.Close(db) })
			var cur, peak, held, calls atomic.Int64
			store := countingStore{TokenRepository: repository.NewTokenRepository(db, tokencrypt.Plaintext{}), cur: &cur, peak: &peak, held: &held, calls: &calls}
			clock := &stormClock{}
			uc, err := usecase.NewRefreshTokenUseCase(store, provider.Only(provider.NewRefresher(w.OAuth, nil)), usecase.Options{Clock: clock, Skew: time.Millisecond})
			if err != nil {
				b.Fatal(err)
			}
			// As in a process that listens for changes (tokenguard's Run):
			// its cache is trusted, so a refresh of a cached token that
			// expired starts at the lock. A process reading through (not
			// listening) reads the token once more before it.
			uc.TrustCache(true)
			// The process's first refresh also opens the pool's connections
			// and prepares its statements, once in the process's life: it is
			// reported on its own. Then warmUp more: Postgres plans a
			// prepared statement afresh for each of its first five runs on a
			// connection before it settles on a generic plan, and a process
			// that has refreshed more than a few times is past them. The
			// figure is the refreshes after those.
			const warmUp = 6
			refresh := func() {
				if _, err := uc.Token(context.Background(), conn); err != nil {
					b.Fatal(err)
				}
			}
			clock.expire(b, seed)
			refresh()
			first := float64(held.Swap(0)) / 1e6
			for range warmUp {
				clock.expire(b, seed)
				refresh()
			}
			// The protocol floor (floor_test.go) refreshes a grant of its
			// own as many times, on the same machine and provider: the time
			// its transactions last is what the protocol's round trips and
			// durable commits cost here.
			floor := newProtocolFloor(b, w, 1)
			var floorHeld atomic.Int64
			floor.stacks[0].dbTime = &floorHeld
			floorRefresh := func() {
				floor.arm()
				if err := floor.stacks[0].next(); err != nil {
					b.Fatal(err)
				}
			}
			for range 1 + warmUp {
				floorRefresh()
			}
			held.Store(0)
			calls.Store(0)
			floorHeld.Store(0)
			w.Provider.SetRefreshLatency(latency)
			settle(b, w.URL)
			// At least ten refreshes, however few ops the benchmark asks
			// for (a 1 s provider makes them few).
			n := max(b.N, 10)
			before := w.Provider.Stats()
			b.ResetTimer()
			for range n {
				b.StopTimer()
				clock.expire(b, seed)
				b.StartTimer()
				refresh()
			}
			b.StopTimer()
			// The floor's after tokenguard's rather than in turns: in turns,
			// tokenguard's pool would sit idle through the floor's refresh
			// and, at 1 s, ping each connection before using it again (pgx
			// checks a connection idle for over a second), which a process
			// refreshing one connection after another does not.
			for range n {
				time.Sleep(100 * time.Millisecond) // as in expire
				floorRefresh()
			}
			refreshes := (w.Provider.Stats().Refreshes - before.Refreshes) / 2
			if refreshes != int64(n) {
				b.Fatalf("%d refreshes for %d expiries", refreshes, n)
			}
			b.ReportMetric(float64(held.Load())/1e6/float64(refreshes), "db-conn-ms/refresh")
			b.ReportMetric(float64(floorHeld.Load())/1e6/float64(refreshes), "floor-db-conn-ms/refresh")
			b.ReportMetric(float64(calls.Load())/float64(refreshes), "store-calls/refresh")
			b.ReportMetric(float64(latency.Milliseconds()), "provider-latency-ms")
			b.ReportMetric(first, "first-refresh-db-conn-ms")
		})
	}
}

// BenchmarkMassExpiry: 1,000 distinct connections expire at once, and 3
// processes, each with a pool of 4 connections and the default bound on
// refreshes in flight, ask for all of them, at a provider answering in
// 1 s. Each connection must be refreshed once, without reuse or failure,
// in about ceil(1000 / (3 x 64)) provider latencies, with at most 3 x 4
// pool connections (and the 3 listeners) open at the database.
func BenchmarkMassExpiry(b *testing.B) {
	quiet(b)
	const (
		conns   = 1000
		stacks  = 3
		pool    = 4
		latency = time.Second
	)
	w := testworld.New(b, time.Hour)
	loader := w.Stack(b, usecase.Options{})
	names := w.ConnectMany(b, loader, conns)
	ucs := make([]*usecase.RefreshTokenUseCase, stacks)
	var cur, peak, calls atomic.Int64
	calling := make([]*callTimer, stacks)
	for i := range ucs {
		db, err := postgres.Open(context.Background(), w.URL, postgres.Pool{MaxOpenConns: pool}, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = postgres.Close(db) })
		store := countingStore{TokenRepository: repository.NewTokenRepository(db, tokencrypt.Plaintext{}), cur: &cur, peak: &peak, calls: &calls}
		calling[i] = &callTimer{Refresher: provider.Only(provider.NewRefresher(w.OAuth, provider.NewHTTPClient(10*time.Second)))}
		uc, err := usecase.NewRefreshTokenUseCase(store, calling[i], usecase.Options{Skew: time.Millisecond})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = repository.NewChangeListener(w.URL, uc, nil).Run(ctx) }()
		b.Cleanup(func() { cancel(); <-done })
		ucs[i] = uc
	}
	admin, err := postgres.Open(context.Background(), w.URL, postgres.Pool{MaxOpenConns: 1}, nil) // the sampler's
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = postgres.Close(admin) })
	_ = postgres.Close(loader.DB) // only the three processes' connections from here on
	w.Provider.SetRefreshLatency(latency)
	settle(b, w.URL)                   // the 1,000 connections' import, for one
	time.Sleep(300 * time.Millisecond) // listeners up

	var seconds, inFlight, busiest []float64
	var failed, peakBackends int64
	var refreshes, reuse, storeCalls int64
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		// Every stored token expires now, as announced to the processes
		// (they drop what they cached); the ones the refreshes store live
		// an hour.
		if err := admin.Exec(`WITH u AS (UPDATE tokenguard_tokens SET expiry = now() - interval '1 second', version = version + 1 RETURNING connection_id, version)
			SELECT count(pg_notify(?, u.version || ' ' || c.name)) FROM u JOIN tokenguard_connections c ON c.id = u.connection_id`, repository.ChangeChannel).Error; err != nil {
			b.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		before := w.Provider.Stats()
		callsBefore := calls.Load()
		for _, c := range calling {
			c.reset()
		}
		stop := sampleBackends(b, admin, &peakBackends)
		b.StartTimer()
		start := time.Now()
		var wg sync.WaitGroup
		for _, uc := range ucs {
			for _, name := range names {
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					defer cancel()
					if _, err := uc.Token(ctx, name); err != nil {
						if atomic.AddInt64(&failed, 1) == 1 {
							b.Logf("first failure: %v", err)
						}
					}
				})
			}
		}
		wg.Wait()
		took := time.Since(start)
		seconds = append(seconds, took.Seconds())
		var busy time.Duration
		var most int64
		for _, c := range calling {
			busy += time.Duration(c.busy.Load())
			most = max(most, c.calls.Load())
		}
		inFlight = append(inFlight, float64(busy)/float64(took))
		busiest = append(busiest, float64(most))
		b.StopTimer()
		stop()
		after := w.Provider.Stats()
		refreshes += after.Refreshes - before.Refreshes
		storeCalls += calls.Load() - callsBefore
		reuse += after.RefreshReuse - before.RefreshReuse
	}
	target := math.Ceil(float64(conns)/float64(stacks*usecase.DefaultMaxRefreshesInFlight)) * latency.Seconds()
	b.ReportMetric(medianOf(seconds), "seconds/expiry")
	b.ReportMetric(target, "target-seconds")
	b.ReportMetric(float64(failed)/float64(b.N), "failed/op")
	b.ReportMetric(float64(refreshes)/float64(b.N*conns), "refreshes/conn")
	b.ReportMetric(float64(reuse), "reuse")
	// Every read, lock transaction and write of the three processes.
	b.ReportMetric(float64(storeCalls)/float64(b.N*conns), "store-calls/conn")
	// Where the time goes: the provider calls in flight on average over
	// the expiry (at most 3 x 64), and the refreshes of the busiest
	// process (the expiry takes at least ceil(that / 64) latencies).
	b.ReportMetric(medianOf(inFlight), "provider-calls-in-flight")
	b.ReportMetric(medianOf(busiest), "busiest-process-refreshes")
	b.ReportMetric(float64(peakBackends), "backends-peak")
	b.ReportMetric(float64(stacks*pool+stacks), "backends-bound")
}

// sampleBackends records in peak the most client backends (but the
// sampler's own) open at the database until stop is called.
func sampleBackends(b *testing.B, admin *gorm.DB, peak *int64) (stop func()) {
	done, over := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(over)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			var n int64
			if err := admin.Raw(`SELECT count(*) - 1 FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend'`).Scan(&n).Error; err == nil && n > *peak {
				*peak = n
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() { close(done); <-over }
}

func medianOf(v []float64) float64 {
	s := append([]float64(nil), v...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s[len(s)/2]
}

// callTimer counts a process's provider calls and the time they took.
type callTimer struct {
	usecase.Refresher
	calls, busy atomic.Int64
}

func (c *callTimer) Refresh(ctx context.Context, provider string, rt domain.Secret) (domain.Grant, error) {
	start := time.Now()
	defer func() { c.calls.Add(1); c.busy.Add(int64(time.Since(start))) }()
	return c.Refresher.Refresh(ctx, provider, rt)
}

func (c *callTimer) reset() { c.calls.Store(0); c.busy.Store(0) }
