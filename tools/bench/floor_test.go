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
	"github.com/tokenguard/tokenguard/internal/testworld"
)

// protocolFloor is the refresh protocol of the design with nothing else,
// written out by hand: per process one pgx connection and, behind a
// sync.OnceValue, three steps, each statement sent in its turn as
// tokenguard sends them. (1) The claim: BEGIN, the lock with its timeout
// (waited for), the re-read with whether another process's lease runs,
// the lease of the due version if it is still stored and free, and a
// durable COMMIT (the lock and the connection are let go). (2) The
// provider call, holding nothing. (3) The write: BEGIN, the lock with its
// timeout, the version-fenced UPDATE with its NOTIFY and the end of the
// lease, and a durable COMMIT. A process that finds another's lease waits
// for the notification on its listener connection, then reads the stored
// version. No pool, cache, flights, encryption, logging, lease
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

func newProtocolFloor(tb testing.TB, w *testworld.World, stacks int) *protocolFloor {
	tb.Helper()
	ctx := context.Background()
	connect := func() *pgx.Conn {
		c, err := pgx.Connect(ctx, w.URL)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = c.Close(context.Background()) })
		return c
	}
	tok, err := sandbox.Grant(ctx, w.OAuth)
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
		s := &floorStack{floor: f, conn: connect(), ref: provider.NewRefresher(w.OAuth, nil), changed: make(chan struct{})}
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

// arm prepares the next storm: every process has ended its last
// transaction and will refresh the version stored now, once.
func (f *protocolFloor) arm() {
	due := f.version.Load()
	for i, s := range f.stacks {
		s.next = sync.OnceValue(func() error { return s.refresh(due, i+1) })
	}
}

// floorLockSQL takes the lock, its wait bounded (lock_timeout) in the same
// statement, as tokenguard's WithAdvisoryLock does.
const floorLockSQL = `WITH s AS MATERIALIZED (SELECT set_config('lock_timeout', '3000ms', true))
	SELECT pg_advisory_xact_lock($1, 1) FROM s`

// refresh redeems the stored refresh token if its version is still due,
// under a lease claimed with the lock, or waits for the process that does.
func (s *floorStack) refresh(due int64, holder int) error {
	ctx := context.Background()
	var (
		rt      string
		version int64
		taken   bool
		leased  int
	)
	// The claim: BEGIN, the lock with its timeout, the re-read with
	// whether another process's lease runs, the lease of version due if it
	// is still stored and free, and a durable COMMIT, each statement in
	// its turn (the lock and the connection are let go at the end).
	t0 := time.Now()
	err := pgx.BeginFunc(ctx, s.conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, floorLockSQL, floorLockSpace); err != nil {
			return err
		}
		// The re-read and the lease in one statement, as tokenguard's claim.
		var took *int
		err := tx.QueryRow(ctx, `WITH cur AS (SELECT t.refresh_token, t.version,
			EXISTS (SELECT FROM floor_leases l WHERE l.id = 1 AND l.version = t.version AND now() <= l.until) AS taken
			FROM floor_tokens t WHERE t.id = 1),
			took AS (INSERT INTO floor_leases AS l SELECT 1, $1, $2, now() + interval '1 second' FROM cur
				WHERE cur.version = $1 AND NOT cur.taken
				ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version, holder = EXCLUDED.holder, until = EXCLUDED.until
				WHERE l.version <> EXCLUDED.version RETURNING holder)
			SELECT cur.refresh_token, cur.version, cur.taken, (SELECT holder FROM took) FROM cur`, due, holder).Scan(&rt, &version, &taken, &took)
		if took != nil {
			leased = *took
		}
		return err
	})
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return err
	}
	s.timed(t0)
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
	// The write: BEGIN, the lock with its timeout, the version-fenced
	// UPDATE with its NOTIFY and the end of the lease, a durable COMMIT.
	var stored int64
	t0 = time.Now()
	err = pgx.BeginFunc(ctx, s.conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, floorLockSQL, floorLockSpace); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `WITH u AS (UPDATE floor_tokens SET refresh_token = $1, version = version + 1 WHERE id = 1 AND version = $2 RETURNING version),
			e AS (DELETE FROM floor_leases WHERE id = 1 AND version < (SELECT version FROM u))
			SELECT u.version FROM u, LATERAL pg_notify($3, u.version::text)`, g.RefreshToken.Reveal(), due, floorChannel).Scan(&stored)
	})
	if err != nil {
		return err
	}
	s.timed(t0)
	if stored != due+1 {
		return errors.New("floor: the write found another version")
	}
	s.floor.version.Store(stored)
	return nil
}
