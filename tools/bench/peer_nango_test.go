package bench_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"golang.org/x/oauth2"
	"golang.org/x/sync/errgroup"

	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/testdb"
	"github.com/tokenguard/tokenguard/internal/testworld"
)

// nangoPeer is Nango's design (NangoHQ/nango, read at 2f4c0af, Aug 2026):
//
//   - every credentials request reads the connection
//     (packages/server/lib/controllers/v1/connections/connectionId/getConnection.ts
//     -> connectionService.getConnection/getConnectionForPrivateApi), then
//     refreshOrTestCredentials (packages/shared/lib/services/connections/credentials/refresh.ts)
//     marks it fetched (connectionService.updateLastFetched: an UPDATE of a
//     row taken FOR UPDATE SKIP LOCKED) and calls refreshCredentialsIfNeeded;
//   - refreshCredentialsIfNeeded collapses a process's concurrent calls into
//     one promise (inFlightRefreshes, a FixedSizeMap of 5,000), then, fresh
//     or not, takes the Redis lock lock:refresh:<env>:<integration>:<connection>
//     with Locking.tryAcquire (packages/kvstore/lib/Locking.ts: SET key 1 NX
//     PX 10000, retried every 50 ms for up to 12 s), re-reads the connection
//     (getConnectionAndFreshCredentials), refreshes only if it expires within
//     the margin (shouldRefreshCredentials, REFRESH_MARGIN 15 min), writes it
//     (connectionService.updateConnection) and releases the lock with a plain
//     DEL (Locking.release, no owner check);
//   - a lock wait that times out re-reads and fails unless another process
//     refreshed.
//
// Credentials are stored unencrypted here, as tokenguard's are in the
// benchmarks. The pool is 20 connections per process, as tokenguard's.
type nangoPeer struct {
	procs      []*nangoProc
	clock      peerClock
	g          gauge
	read       *pgxpool.Pool
	lockPrefix string
}

// nangoProc is one Nango server process.
type nangoProc struct {
	peer     *nangoPeer
	db       *pgxpool.Pool
	redis    *redis.Client
	cfg      *oauth2.Config
	mu       sync.Mutex
	inFlight map[string]*nangoFlight
}

type nangoFlight struct {
	done chan struct{}
	err  error
}

const nangoMargin = 15 * time.Minute

type nangoConnection struct {
	id           int64
	accessToken  string
	refreshToken string
	expiresAt    time.Time
}

func newNangoPeer(tb testing.TB, w *testworld.World, stacks int) *nangoPeer {
	tb.Helper()
	p := &nangoPeer{}
	dbURL := testdb.NewEmpty(tb)
	p.read = countedPool(tb, dbURL, 2, &gauge{})
	nangoSchema(tb, p.read)
	tok := peerGrant(tb, w)
	if _, err := p.read.Exec(context.Background(), `INSERT INTO _nango_connections (connection_id, access_token, refresh_token, expires_at)
		VALUES ('acme', $1, $2, $3)`, tok.AccessToken, tok.RefreshToken, tok.Expiry); err != nil {
		tb.Fatal(err)
	}
	p.clock.issued()
	// The key names this database, so that runs sharing the Redis server
	// never meet.
	p.lockPrefix = "lock:refresh:" + databaseName(tb, dbURL) + ":sandbox:"
	for range stacks {
		rc := redis.NewClient(&redis.Options{Addr: redisAddr()})
		if err := rc.Ping(context.Background()).Err(); err != nil {
			tb.Fatalf("the Nango-style peer needs Redis at %s (TEST_REDIS_ADDR): %v", redisAddr(), err)
		}
		tb.Cleanup(func() { _ = rc.Close() })
		p.procs = append(p.procs, &nangoProc{peer: p, db: countedPool(tb, dbURL, 20, &p.g), redis: rc, cfg: w.OAuth, inFlight: map[string]*nangoFlight{}})
	}
	tb.Cleanup(func() { _ = p.procs[0].redis.Del(context.Background(), p.lockPrefix+"acme").Err() })
	return p
}

func nangoSchema(tb testing.TB, db *pgxpool.Pool) {
	tb.Helper()
	if _, err := db.Exec(context.Background(), `CREATE TABLE _nango_connections (
		id serial PRIMARY KEY,
		connection_id text NOT NULL UNIQUE,
		access_token text NOT NULL,
		refresh_token text NOT NULL,
		expires_at timestamptz NOT NULL,
		deleted boolean NOT NULL DEFAULT false,
		refresh_exhausted boolean NOT NULL DEFAULT false,
		last_fetched_at timestamptz,
		last_refresh_success timestamptz,
		updated_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		tb.Fatal(err)
	}
}

func databaseName(tb testing.TB, dbURL string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		tb.Fatal(err)
	}
	return strings.TrimPrefix(u.Path, "/")
}

func (p *nangoPeer) watch() func() int64 { return p.g.watch() }

func (p *nangoPeer) expire(tb testing.TB) {
	var exp time.Time
	if err := p.read.QueryRow(context.Background(), `SELECT expires_at FROM _nango_connections WHERE connection_id = 'acme'`).Scan(&exp); err != nil {
		tb.Fatal(err)
	}
	p.clock.pass(exp.Add(-nangoMargin))
}

func (p *nangoPeer) call(ctx context.Context, i int) error {
	s := p.procs[i]
	c, err := s.getConnection(ctx, "acme")
	if err != nil {
		return err
	}
	return s.refreshOrTestCredentials(ctx, c, "acme")
}

// getConnection reads the connection, as every request does.
func (s *nangoProc) getConnection(ctx context.Context, name string) (nangoConnection, error) {
	var c nangoConnection
	err := s.db.QueryRow(ctx, `SELECT id, access_token, refresh_token, expires_at FROM _nango_connections
		WHERE connection_id = $1 AND deleted = false LIMIT 1`, name).Scan(&c.id, &c.accessToken, &c.refreshToken, &c.expiresAt)
	return c, err
}

func (s *nangoProc) refreshOrTestCredentials(ctx context.Context, c nangoConnection, name string) error {
	// updateLastFetched: skipped, not waited for, if another request holds
	// the row.
	if _, err := s.db.Exec(ctx, `UPDATE _nango_connections SET last_fetched_at = now() WHERE id IN (
		SELECT id FROM _nango_connections WHERE id = $1 AND deleted = false FOR UPDATE SKIP LOCKED)`, c.id); err != nil {
		return err
	}
	return s.refreshCredentialsIfNeeded(ctx, name)
}

// refreshCredentialsIfNeeded joins the process's in-flight refresh of the
// connection, or starts one.
func (s *nangoProc) refreshCredentialsIfNeeded(ctx context.Context, name string) error {
	s.mu.Lock()
	if f, ok := s.inFlight[name]; ok {
		s.mu.Unlock()
		<-f.done
		return f.err
	}
	f := &nangoFlight{done: make(chan struct{})}
	s.inFlight[name] = f
	s.mu.Unlock()
	f.err = s.executeRefresh(context.WithoutCancel(ctx), name)
	s.mu.Lock()
	delete(s.inFlight, name)
	s.mu.Unlock()
	close(f.done)
	return f.err
}

func (s *nangoProc) fresh(c nangoConnection) bool {
	return c.expiresAt.After(s.peer.clock.Now().Add(nangoMargin))
}

func (s *nangoProc) executeRefresh(ctx context.Context, name string) error {
	const ttl, acquireTimeout = 10 * time.Second, 12 * time.Second
	key := s.peer.lockPrefix + name
	if err := s.tryAcquire(ctx, key, ttl, acquireTimeout); err != nil {
		// Another execution may have refreshed while we waited.
		c, rerr := s.getConnection(ctx, name)
		if rerr == nil && s.fresh(c) {
			return nil
		}
		return err
	}
	defer s.redis.Del(context.WithoutCancel(ctx), key)
	c, err := s.getConnection(ctx, name)
	if err != nil {
		return err
	}
	if s.fresh(c) {
		return nil
	}
	tok, err := refreshWith(ctx, s.cfg, c.refreshToken)
	if err != nil {
		return err
	}
	_, err = s.db.Exec(ctx, `UPDATE _nango_connections SET access_token = $2, refresh_token = $3, expires_at = $4,
		last_fetched_at = now(), last_refresh_success = now(), updated_at = now() WHERE id = $1`,
		c.id, tok.AccessToken, tok.RefreshToken, tok.Expiry)
	return err
}

// tryAcquire is Locking.tryAcquire: SET NX PX, polled every 50 ms.
func (s *nangoProc) tryAcquire(ctx context.Context, key string, ttl, timeout time.Duration) error {
	start := time.Now()
	for time.Since(start) < timeout {
		ok, err := s.redis.SetNX(ctx, key, "1", ttl).Result()
		if err == nil && ok {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("acquiring lock for key %s timed out after %v", key, timeout)
}

// BenchmarkProactiveRefreshNangoCron is Nango's refresh cron
// (packages/server/lib/crons/refreshConnections.ts, exec): one process
// (it holds a Redis lock for the whole run) pages through the connections
// not fetched for a day, 100 at a time in id order
// (connectionService.getStaleConnections), and passes each one, one after
// the other, through refreshOrTestCredentials. Here 1,000 connections, all
// due, against the provider with the latency of BenchmarkProactiveRefresh:
// the two sweeps' rates compare in the report.
func BenchmarkProactiveRefreshNangoCron(b *testing.B) {
	quiet(b)
	const (
		conns   = 1000
		page    = 100
		latency = 20 * time.Millisecond
	)
	w := testworld.New(b, time.Hour)
	p := newNangoPeer(b, w, 1)
	s := p.procs[0]
	ctx := context.Background()
	loadNangoConnections(b, w, p.read, conns-1) // and the peer's own, acme
	w.Provider.SetRefreshLatency(latency)
	before := w.Provider.Stats()
	var (
		swept   int
		elapsed time.Duration
	)
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		if _, err := p.read.Exec(ctx, `UPDATE _nango_connections SET last_fetched_at = NULL`); err != nil {
			b.Fatal(err)
		}
		// Every connection is due: the clock is past every expiry.
		var latest time.Time
		if err := p.read.QueryRow(ctx, `SELECT max(expires_at) FROM _nango_connections`).Scan(&latest); err != nil {
			b.Fatal(err)
		}
		p.clock.pass(latest.Add(-nangoMargin))
		refreshed := w.Provider.Stats().Refreshes
		b.StartTimer()
		start := time.Now()
		n, err := s.cron(ctx, page)
		elapsed += time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if got := w.Provider.Stats().Refreshes - refreshed; n != conns || got != conns {
			b.Fatalf("cron passed %d connections and refreshed %d of %d", n, got, conns)
		}
		swept += n
		b.StartTimer()
	}
	b.StopTimer()
	after := w.Provider.Stats()
	b.ReportMetric(float64(swept)/elapsed.Seconds(), "conns/s")
	b.ReportMetric(float64(after.RefreshReuse-before.RefreshReuse), "reuse")
}

// loadNangoConnections grants and stores n connections.
func loadNangoConnections(tb testing.TB, w *testworld.World, db *pgxpool.Pool, n int) {
	tb.Helper()
	var g errgroup.Group
	g.SetLimit(16)
	for i := range n {
		g.Go(func() error {
			tok, err := sandbox.Grant(context.Background(), w.OAuth)
			if err != nil {
				return err
			}
			_, err = db.Exec(context.Background(), `INSERT INTO _nango_connections (connection_id, access_token, refresh_token, expires_at)
				VALUES ($1, $2, $3, $4)`, fmt.Sprintf("cron-%d", i), tok.AccessToken, tok.RefreshToken, tok.Expiry)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		tb.Fatal(err)
	}
}

// cron is one run of the refresh cron; it returns how many connections it
// passed through refreshOrTestCredentials.
func (s *nangoProc) cron(ctx context.Context, page int) (int, error) {
	var cursor int64
	passed := 0
	for {
		rows, err := s.db.Query(ctx, `SELECT id, connection_id FROM _nango_connections
			WHERE deleted = false AND refresh_exhausted = false
			  AND (last_fetched_at < now() - interval '1 day' OR last_fetched_at IS NULL)
			  AND id > $1 ORDER BY id LIMIT $2`, cursor, page)
		if err != nil {
			return passed, err
		}
		type stale struct {
			id   int64
			name string
		}
		var list []stale
		for rows.Next() {
			var st stale
			if err := rows.Scan(&st.id, &st.name); err != nil {
				rows.Close()
				return passed, err
			}
			list = append(list, st)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return passed, err
		}
		for _, st := range list {
			c, err := s.getConnection(ctx, st.name)
			if err != nil {
				return passed, err
			}
			if err := s.refreshOrTestCredentials(ctx, c, st.name); err != nil {
				return passed, err
			}
			passed++
			cursor = st.id
		}
		if len(list) < page {
			return passed, nil
		}
	}
}

func (p *nangoPeer) rest() {
	for _, proc := range p.procs {
		resetPools(proc.db)
	}
}
