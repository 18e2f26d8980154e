package usecase_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/internal/sandbox"
)

// protocolFloor is the refresh protocol of the design with nothing else:
// per process one pgx connection and, behind a sync.OnceValue, the lock and
// the re-read in one round trip (exclusive if the lock is free, otherwise
// waiting for its holder in shared mode), the refresh lease committed on a
// second connection, the provider call, then the write with its NOTIFY and
// a durable COMMIT in one more; a listener connection per process that
// takes the notifications. No pool, cache, flights, encryption, logging,
// lease renewal or metrics.
//
// BenchmarkRefreshStorm runs it with the same fan-out after each storm:
// the storm's waits above the floor's are what tokenguard's code costs, and
// the floor's above the provider-only storm's are what the design itself
// costs on this machine (round trips, a WAL flush, waking the processes).
type protocolFloor struct {
	stacks  []*floorStack
	version atomic.Int64 // the stored version, as the last write returned it
}

// floorStack is one process of the floor.
type floorStack struct {
	floor *protocolFloor
	conn  *pgx.Conn
	lease *pgx.Conn // the refresh lease's own connection
	ref   *provider.Refresher
	bg    sync.WaitGroup // the ROLLBACK of a transaction that only read
	next  func() error
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
	if _, err := setup.Exec(ctx, `CREATE TABLE floor_tokens (id int PRIMARY KEY, refresh_token text NOT NULL, version bigint NOT NULL)`); err != nil {
		tb.Fatal(err)
	}
	if _, err := setup.Exec(ctx, `INSERT INTO floor_tokens VALUES (1, $1, 1)`, tok.RefreshToken); err != nil {
		tb.Fatal(err)
	}
	if _, err := setup.Exec(ctx, `CREATE TABLE floor_leases (id int PRIMARY KEY, version bigint NOT NULL, until timestamptz NOT NULL)`); err != nil {
		tb.Fatal(err)
	}
	f := &protocolFloor{}
	f.version.Store(1)
	for range stacks {
		l := connect()
		if _, err := l.Exec(ctx, "LISTEN "+floorChannel); err != nil {
			tb.Fatal(err)
		}
		lctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				if _, err := l.WaitForNotification(lctx); err != nil {
					return
				}
			}
		}()
		tb.Cleanup(func() { cancel(); <-done })
		f.stacks = append(f.stacks, &floorStack{floor: f, conn: connect(), lease: connect(), ref: provider.NewRefresher(w.oauth, nil)})
	}
	return f
}

// arm prepares the next storm: every process has ended its last
// transaction and will refresh the version stored now, once.
func (f *protocolFloor) arm() {
	due := f.version.Load()
	for _, s := range f.stacks {
		s.bg.Wait()
		s.next = sync.OnceValue(func() error { return s.refresh(due) })
	}
}

// refresh redeems the stored refresh token if its version is still due,
// under the lock, or waits for the process that does.
func (s *floorStack) refresh(due int64) error {
	ctx := context.Background()
	var (
		held    int
		rt      string
		version int64
		b       pgx.Batch
	)
	b.Queue("BEGIN")
	b.Queue(`SELECT CASE WHEN pg_try_advisory_xact_lock($1, 1) THEN 1
		WHEN pg_advisory_xact_lock_shared($1, 1) IS NOT NULL THEN 2 END`, floorLockSpace).QueryRow(func(r pgx.Row) error { return r.Scan(&held) })
	b.Queue(`SELECT refresh_token, version FROM floor_tokens WHERE id = 1`).QueryRow(func(r pgx.Row) error { return r.Scan(&rt, &version) })
	if err := s.conn.SendBatch(ctx, &b).Close(); err != nil {
		return err
	}
	if held != 1 || version != due {
		// Another process has refreshed: what it stored is in hand.
		s.bg.Go(func() { _, _ = s.conn.Exec(ctx, "ROLLBACK") })
		return nil
	}
	var leased int64
	if err := s.lease.QueryRow(ctx, `INSERT INTO floor_leases AS l VALUES (1, $1, now() + interval '1 second')
		ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version, until = EXCLUDED.until
		WHERE l.version <> EXCLUDED.version OR now() > l.until RETURNING version`, due).Scan(&leased); err != nil {
		_, _ = s.conn.Exec(ctx, "ROLLBACK")
		return err
	}
	g, err := s.ref.Refresh(ctx, domain.NewSecret(rt))
	if err != nil {
		_, _ = s.conn.Exec(ctx, "ROLLBACK")
		return err
	}
	var stored int64
	var w pgx.Batch
	w.Queue(`WITH u AS (UPDATE floor_tokens SET refresh_token = $1, version = version + 1 WHERE id = 1 AND version = $2 RETURNING version)
		SELECT u.version FROM u, LATERAL pg_notify($3, u.version::text)`, g.RefreshToken.Reveal(), due, floorChannel).
		QueryRow(func(r pgx.Row) error { return r.Scan(&stored) })
	w.Queue("COMMIT")
	if err := s.conn.SendBatch(ctx, &w).Close(); err != nil {
		return err
	}
	if stored != due+1 {
		return errors.New("floor: the write found another version")
	}
	s.floor.version.Store(stored)
	return nil
}
