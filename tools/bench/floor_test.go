package bench_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/internal/sandbox"
)

// protocolFloor is the refresh protocol of the design with nothing else,
// written out by hand: per process one pgx connection and, behind a
// sync.OnceValue, three steps. (1) The claim, in one round trip: BEGIN, a
// try of the lock, the re-read, whether another process's lease runs, the
// lease of the due version if the lock was granted, and a durable COMMIT
// (the lock and the connection are let go). A lock held by another: 5 ms
// or an announcement, a read of the token and its lease, and the claim
// again, waiting for the lock, only if no lease runs. (2) The provider
// call, holding nothing. (3) The write: BEGIN, the lock, the
// version-fenced UPDATE with its NOTIFY, the end of the lease and a
// durable COMMIT, in one round trip. A process that finds another's
// lease waits for the notification on its listener connection, then reads
// the stored version. No pool, cache, flights, encryption, logging, lease
// renewal, in-flight slots or metrics.
//
// BenchmarkRefreshStorm runs it with the same fan-out after each storm:
// the storm's waits above the floor's are what tokenguard's code costs, and
// the floor's above the provider-only storm's are what the design itself
// costs on this machine (round trips, WAL flushes, waking the processes).
type protocolFloor struct {
	stacks  []*floorStack
	version atomic.Int64 // the stored version, as the last write returned it
}

// floorStack is one process of the floor.
type floorStack struct {
	floor *protocolFloor
	conn  *pgx.Conn
	ref   *provider.Refresher
	next  func() error

	mu      sync.Mutex
	seen    int64         // the newest version the listener heard of
	changed chan struct{} // closed when seen moves

	// dbTime, if set, sums the time the process's transactions last
	// (BenchmarkConnectionTime), in nanoseconds.
	dbTime *atomic.Int64
}

// timed adds the time since t0 to dbTime, if set.
func (s *floorStack) timed(t0 time.Time) {
	if s.dbTime != nil {
		s.dbTime.Add(int64(time.Since(t0)))
	}
}

const (
	floorLockSpace = 0x666c6f72 // "flor": apart from tokenguard's lock keys
	floorChannel   = "floor_token_changed"
)

func newProtocolFloor(tb testing.TB, w *world, stacks int) *protocolFloor {
	tb.Helper()
	ctx := context.Background()
	connect := func() *pgx.Conn {
		c, err := pgx.Connect(ctx, w.url)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = c.Close(context.Background()) })
		return c
	}
	tok, err := sandbox.Grant(ctx, w.oauth)
	if err != nil {
		tb.Fatal(err)
	}
	setup := connect()
	for _, stmt := range []string{
		`CREATE TABLE floor_tokens (id int PRIMARY KEY, refresh_token text NOT NULL, version bigint NOT NULL)`,
		`CREATE TABLE floor_leases (id int PRIMARY KEY, version bigint NOT NULL, holder int NOT NULL, until timestamptz NOT NULL)`,
	} {
		if _, err := setup.Exec(ctx, stmt); err != nil {
			tb.Fatal(err)
		}
	}
	if _, err := setup.Exec(ctx, `INSERT INTO floor_tokens VALUES (1, $1, 1)`, tok.RefreshToken); err != nil {
		tb.Fatal(err)
	}
	f := &protocolFloor{}
	f.version.Store(1)
	for range stacks {
		s := &floorStack{floor: f, conn: connect(), ref: provider.NewRefresher(w.oauth, nil), changed: make(chan struct{})}
		l := connect()
		if _, err := l.Exec(ctx, "LISTEN "+floorChannel); err != nil {
			tb.Fatal(err)
		}
		lctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				n, err := l.WaitForNotification(lctx)
				if err != nil {
					return
				}
				v, _ := strconv.ParseInt(n.Payload, 10, 64)
				s.heard(v)
			}
		}()
		tb.Cleanup(func() { cancel(); <-done })
		f.stacks = append(f.stacks, s)
	}
	return f
}

// heard records a version the listener announced and wakes the waiters.
func (s *floorStack) heard(v int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v > s.seen {
		s.seen = v
		close(s.changed)
		s.changed = make(chan struct{})
	}
}

// awaitVersion waits until the listener heard of version v.
func (s *floorStack) awaitVersion(v int64) {
	for {
		s.mu.Lock()
		seen, changed := s.seen, s.changed
		s.mu.Unlock()
		if seen >= v {
			return
		}
		<-changed
	}
}

// awaitVersionFor is awaitVersion for at most d.
func (s *floorStack) awaitVersionFor(v int64, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		s.mu.Lock()
		seen, changed := s.seen, s.changed
		s.mu.Unlock()
		if seen >= v {
			return
		}
		select {
		case <-changed:
		case <-t.C:
			return
		}
	}
}

// arm prepares the next storm: every process has ended its last
// transaction and will refresh the version stored now, once.
func (f *protocolFloor) arm() {
	due := f.version.Load()
	for i, s := range f.stacks {
		s.next = sync.OnceValue(func() error { return s.refresh(due, i+1) })
	}
}

// refresh redeems the stored refresh token if its version is still due,
// under a lease bid for with the lock, or waits for the process that does.
func (s *floorStack) refresh(due int64, holder int) error {
	ctx := context.Background()
	var (
		rt      string
		version int64
		taken   bool
		held    = true
		leased  int
	)
	// claim is the lock's round trip: BEGIN, the lock (only tried, as
	// tokenguard's first look does, unless wait), the re-read, whether
	// another process's lease runs, the lease of version due if the lock
	// was granted, and a durable COMMIT.
	claim := func(wait bool) error {
		var b pgx.Batch
		b.Queue("BEGIN")
		if wait {
			b.Queue(`SELECT set_config('floor.locked', (pg_advisory_xact_lock($1, 1) IS NOT NULL)::text, true)::bool`, floorLockSpace).
				QueryRow(func(r pgx.Row) error { return r.Scan(&held) })
		} else {
			b.Queue(`SELECT set_config('floor.locked', pg_try_advisory_xact_lock($1, 1)::text, true)::bool`, floorLockSpace).
				QueryRow(func(r pgx.Row) error { return r.Scan(&held) })
		}
		b.Queue(`SELECT refresh_token, version FROM floor_tokens WHERE id = 1`).QueryRow(func(r pgx.Row) error { return r.Scan(&rt, &version) })
		b.Queue(`SELECT EXISTS (SELECT FROM floor_leases WHERE id = 1 AND version = $1 AND now() <= until)`, due).QueryRow(func(r pgx.Row) error { return r.Scan(&taken) })
		leased = 0
		b.Queue(`INSERT INTO floor_leases AS l SELECT 1, $1, $2, now() + interval '1 second' FROM floor_tokens t
			WHERE t.id = 1 AND t.version = $1 AND current_setting('floor.locked', true) = 'true'
			ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version, holder = EXCLUDED.holder, until = EXCLUDED.until
			WHERE l.version <> EXCLUDED.version OR now() > l.until RETURNING holder`, due, holder).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				if err := rows.Scan(&leased); err != nil {
					return err
				}
			}
			return rows.Err()
		})
		b.Queue("COMMIT")
		return s.conn.SendBatch(ctx, &b).Close()
	}
	t0 := time.Now()
	if err := claim(false); err != nil {
		return err
	}
	s.timed(t0)
	if !held {
		// Another transaction had the lock, most likely a process taking
		// the lease: wait 5 ms or for an announcement, read the token and
		// whether a lease runs (no lock); while it runs, wait for the
		// write's announcement.
		s.awaitVersionFor(due+1, 5*time.Millisecond)
		if err := s.conn.QueryRow(ctx, `SELECT t.version, EXISTS (SELECT FROM floor_leases l WHERE l.id = 1 AND l.version = t.version AND now() <= l.until)
			FROM floor_tokens t WHERE t.id = 1`).Scan(&version, &taken); err != nil {
			return err
		}
		if version == due && taken {
			s.awaitVersion(due + 1)
			return s.conn.QueryRow(ctx, `SELECT version FROM floor_tokens WHERE id = 1`).Scan(&version)
		}
		if version != due {
			return nil
		}
		// Neither: the next look waits for the lock.
		t0 = time.Now()
		if err := claim(true); err != nil {
			return err
		}
		s.timed(t0)
	}
	if version != due {
		return nil // another process has refreshed: what it stored is in hand
	}
	if leased != holder {
		// Another process is at the provider: wait for its write's
		// announcement, then read what it stored.
		s.awaitVersion(due + 1)
		return s.conn.QueryRow(ctx, `SELECT version FROM floor_tokens WHERE id = 1`).Scan(&version)
	}
	g, err := s.ref.Refresh(ctx, domain.NewSecret(rt))
	if err != nil {
		return err
	}
	var stored int64
	var w pgx.Batch
	t0 = time.Now()
	w.Queue("BEGIN")
	w.Queue(`SELECT pg_advisory_xact_lock($1, 1)`, floorLockSpace)
	w.Queue(`WITH u AS (UPDATE floor_tokens SET refresh_token = $1, version = version + 1 WHERE id = 1 AND version = $2 RETURNING version),
		e AS (DELETE FROM floor_leases WHERE id = 1 AND version < (SELECT version FROM u))
		SELECT u.version FROM u, LATERAL pg_notify($3, u.version::text)`, g.RefreshToken.Reveal(), due, floorChannel).
		QueryRow(func(r pgx.Row) error { return r.Scan(&stored) })
	w.Queue("COMMIT")
	if err := s.conn.SendBatch(ctx, &w).Close(); err != nil {
		return err
	}
	s.timed(t0)
	if stored != due+1 {
		return errors.New("floor: the write found another version")
	}
	s.floor.version.Store(stored)
	return nil
}
