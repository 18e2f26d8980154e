package repository_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/repository"
)

// storeRotation stores connection's rotation from rt-1 to rt-2 under a lease of this process, as
// a refresh does: the rotation is kept.
func storeRotation(t *testing.T, r *repository.TokenRepository, connection string) {
	t.Helper()
	seen := put(t, r, grantToken(connection, "at-1", "rt-1"))
	claimed := seen
	claimed.RefreshToken = domain.Secret{} // as the use case's cache holds it
	end, err := lease(t, r, claimed)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Store(context.Background(), seen.Rotated(domain.Grant{AccessToken: domain.NewSecret("at-2"), RefreshToken: domain.NewSecret("rt-2")}, time.Now())); err != nil {
		t.Fatal(err)
	}
	end(false)
}

// A rotation the database lost is written back by the process that stored
// it only over the refresh token that rotation spent: acme, found back at
// its spent token, is written back; globex, found behind its rotation but
// holding another refresh token (not one this process spent), is left as
// it is.
func TestLostRotationIsWrittenBackOnlyOverTheTokenItSpent(t *testing.T) {
	r, db, _ := newRepo(t)
	ctx := context.Background()
	written := make(chan string, 2)
	r.OnRotationWrittenBack(func(connection string, lost, found, stored int64) { written <- connection })
	for _, name := range []string{"acme", "globex"} {
		storeRotation(t, r, name)
	}
	// As a restore from backup leaves them: back at version 1.
	if err := db.Exec(`UPDATE tokenguard_tokens t SET version = 1, access_token = 'at-1',
    refresh_token = CASE c.name WHEN 'acme' THEN 'rt-1' ELSE 'rt-other' END
FROM tokenguard_connections c WHERE c.id = t.connection_id`).Error; err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-written:
		if c != "acme" {
			t.Fatalf("%s written back, want acme", c)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("acme's lost rotation was never written back")
	}
	time.Sleep(time.Second) // more of the renewer's ticks: globex stays as it is
	for name, want := range map[string]string{"acme": "rt-2", "globex": "rt-other"} {
		tok, err := r.Get(ctx, name)
		if err != nil || tok.RefreshToken.Reveal() != want {
			t.Errorf("%s holds %q (%v), want %q", name, tok.RefreshToken.Reveal(), err, want)
		}
	}
	if len(written) != 0 {
		t.Errorf("%s written back too, want acme only", <-written)
	}
}

// The kept rotations are checked on an idle connection of the pool, for up to 2 s: on a busy pool
// the check would open a connection, which the refresh path takes next and on which it prepares
// every statement again. A lost rotation is still written back within the grace (5 s) in which
// the new timeline grants no lease.
func TestKeptRotationsAreCheckedOnAnIdleConnection(t *testing.T) {
	r, db, _ := newRepo(t)
	ctx := context.Background()
	written := make(chan struct{}, 1)
	r.OnRotationWrittenBack(func(string, int64, int64, int64) { written <- struct{}{} })
	storeRotation(t, r, "acme")

	pool, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	var held []*sql.Conn // every idle connection: the pool is busy
	for pool.Stats().Idle > 0 {
		c, err := pool.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	defer func() {
		for _, c := range held {
			_ = c.Close()
		}
	}()
	open := pool.Stats().OpenConnections
	// As a restore from backup leaves it, back at the spent refresh token.
	if _, err := held[0].ExecContext(ctx, `UPDATE tokenguard_tokens SET version = 1, access_token = 'at-1', refresh_token = 'rt-1'`); err != nil {
		t.Fatal(err)
	}
	busy := time.Now()
	select {
	case <-written:
	case <-time.After(10 * time.Second):
		t.Fatal("the lost rotation was never written back while the pool stayed busy")
	}
	switch waited := time.Since(busy); {
	case waited < time.Second:
		t.Errorf("written back %v after the pool became busy: the check opened a connection at once", waited.Round(time.Millisecond))
	case waited > 5*time.Second:
		t.Errorf("written back %v after the pool became busy: past the grace", waited.Round(time.Millisecond))
	}
	if now := pool.Stats().OpenConnections; now <= open {
		t.Errorf("%d connections open, %d before: the check never opened one", now, open)
	}
}
