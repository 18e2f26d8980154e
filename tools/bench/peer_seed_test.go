package bench_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/postgres"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/internal/testdb"
	"github.com/tokenguard/tokenguard/internal/testworld"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// seedPeer is this repository's refresh path as its first commit wrote it
// (26ec1bb: usecase/refresh.go RefreshTokenUseCase.Token and refresh,
// repository/tokens.go InLock, LockedTokens.Get and Save): every call reads
// the row; an expired token is refreshed in BEGIN; SET LOCAL lock_timeout;
// pg_advisory_xact_lock (TokenRepository.WithAdvisoryLock on the GORM
// transaction); re-read; refresh; UPDATE; re-read; COMMIT. No cache, no
// shared waiters: every caller that found the token expired takes its
// turn at the lock. Default skew (30 s) and lock wait (15 s); the pool is
// 20 connections per process. Its database is its own, migrated like
// tokenguard's, so its advisory locks never meet tokenguard's.
type seedPeer struct {
	procs []*seedProc
	clock peerClock
	read  *repository.TokenRepository
}

type seedProc struct {
	peer  *seedPeer
	db    *gorm.DB
	sqlDB *sql.DB
	repo  *repository.TokenRepository
	ref   *provider.Refresher
}

const (
	seedSkew     = 30 * time.Second
	seedLockWait = 15 * time.Second
)

func newSeedPeer(tb testing.TB, w *testworld.World, stacks int) *seedPeer {
	tb.Helper()
	p := &seedPeer{}
	dbURL := testdb.New(tb)
	open := func(conns int) *gorm.DB {
		db, err := postgres.Open(context.Background(), dbURL, postgres.Pool{MaxOpenConns: conns}, nil)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = postgres.Close(db) })
		return db
	}
	setup := open(2)
	p.read = repository.NewTokenRepository(setup, tokencrypt.Plaintext{})
	if _, err := usecase.NewConnectUseCase(p.read, nil, time.Second).Connect(context.Background(), conn, provider.GrantFrom(peerGrant(tb, w))); err != nil {
		tb.Fatal(err)
	}
	p.clock.issued()
	for range stacks {
		db := open(20)
		sqlDB, err := db.DB()
		if err != nil {
			tb.Fatal(err)
		}
		p.procs = append(p.procs, &seedProc{peer: p, db: db, sqlDB: sqlDB, repo: repository.NewTokenRepository(db, tokencrypt.Plaintext{}), ref: provider.NewRefresher(w.OAuth, nil)})
	}
	return p
}

// watch samples the pools' connections in use every 100 µs: database/sql
// tells when a connection is taken from its pool to nobody but itself.
func (p *seedPeer) watch() func() int64 {
	var peak atomic.Int64
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(100 * time.Microsecond)
		defer t.Stop()
		for {
			var n int64
			for _, s := range p.procs {
				n += int64(s.sqlDB.Stats().InUse)
			}
			peak.Store(max(peak.Load(), n))
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	return func() int64 { close(stop); <-done; return peak.Load() }
}

func (p *seedPeer) expire(tb testing.TB) {
	t, err := p.read.Get(context.Background(), conn)
	if err != nil {
		tb.Fatal(err)
	}
	p.clock.pass(t.Expiry.Add(-t.EffectiveSkew(seedSkew)))
}

// call is RefreshTokenUseCase.Token as the seed wrote it.
func (p *seedPeer) call(ctx context.Context, i int) error {
	s := p.procs[i]
	t, err := s.repo.Get(ctx, conn)
	if err != nil {
		return err
	}
	if t.FreshAt(p.clock.Now(), seedSkew) {
		return nil
	}
	return s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec("SELECT set_config('lock_timeout', ?, true)", fmt.Sprintf("%dms", seedLockWait.Milliseconds())).Error; err != nil {
			return err
		}
		if err := s.repo.WithAdvisoryLock(tx, conn); err != nil {
			return err
		}
		locked := repository.NewTokenRepository(tx, tokencrypt.Plaintext{})
		t, err := locked.Get(ctx, conn)
		if err != nil {
			return err
		}
		if t.FreshAt(p.clock.Now(), seedSkew) {
			return nil // another process refreshed while we waited
		}
		g, err := s.ref.Refresh(ctx, t.RefreshToken)
		if err != nil {
			return err
		}
		return seedSave(ctx, tx, locked, t.Rotated(g, p.clock.Now()))
	})
}

// seedSave is the seed's LockedTokens.Save: the versioned UPDATE, then a
// re-read of what was stored.
func seedSave(ctx context.Context, tx *gorm.DB, locked *repository.TokenRepository, t domain.Token) error {
	var out struct{ Version int64 }
	res := tx.WithContext(ctx).Raw(`
UPDATE tokenguard_tokens AS t SET
    access_token  = ?,
    token_type    = ?,
    refresh_token = COALESCE(NULLIF(?, ''), t.refresh_token),
    expiry        = ?,
    obtained_at   = ?,
    status        = ?,
    status_reason = ?,
    version       = t.version + 1,
    updated_at    = now()
FROM tokenguard_connections c
WHERE c.id = t.connection_id AND c.name = ? AND t.version = ?
RETURNING t.version`,
		t.AccessToken.Reveal(), t.TokenType, t.RefreshToken.Reveal(), t.Expiry, t.ObtainedAt,
		string(t.Status), t.StatusReason, t.Connection, t.Version).Scan(&out)
	if res.Error != nil {
		return res.Error
	}
	if res.RowsAffected == 0 {
		return fmt.Errorf("save token of %s at version %d: %w", t.Connection, t.Version, domain.ErrConflict)
	}
	_, err := locked.Get(ctx, t.Connection)
	return err
}

func (p *seedPeer) rest() {
	for _, proc := range p.procs {
		proc.sqlDB.SetMaxIdleConns(0) // closes the idle ones
		proc.sqlDB.SetMaxIdleConns(5)
	}
}
