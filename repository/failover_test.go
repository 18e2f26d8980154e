//go:build unix

package repository_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/internal/pgserver"
	"github.com/tokenguard/tokenguard/internal/waitfor"
	"github.com/tokenguard/tokenguard/migrations"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// A lease the old primary acknowledged but never sent to its asynchronous
// standby is lost by the failover, while its holder's request may still be
// at the provider. On the promoted server (a new timeline) no lease is
// granted for the grace after the timeline's first claim, and the holder
// restores its lease meanwhile: nobody else presents that refresh token.
// The control, a holder that does not restore its lease, loses it to the
// next claim once the grace is over: what the hold and the restore prevent.
func TestLeaseLostInAFailoverIsRestoredBeforeAnyoneClaims(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p, url := startAsyncPair(ctx, t)
	holder := repository.NewTokenRepository(open(t, url), tokencrypt.Plaintext{}) // restores its leases
	gone := repository.NewTokenRepository(open(t, url), tokencrypt.Plaintext{})   // the control's holder
	other := repository.NewTokenRepository(open(t, url), tokencrypt.Plaintext{})  // another process
	acme := put(t, holder, grantToken("acme", "at-1", "rt-1"))
	globex := put(t, holder, grantToken("globex", "at-1", "rt-1"))
	end, err := lease(t, holder, acme) // the first timeline is recorded
	if err != nil {
		t.Fatal(err)
	}
	end(true)
	waitfor.Until(t, 30*time.Second, "the standby never received the first timeline", func() bool {
		return count(ctx, p.StandbyURL(), "SELECT count(*) FROM tokenguard_timelines") == 1
	})

	type claimed struct {
		end func(bool)
		err error
	}
	taken := make(chan [2]claimed, 1)
	failedOver := make(chan error, 1)
	go func() {
		_, err := p.Failover(ctx, 2*time.Second, func(ctx context.Context, standbyURL string) {
			c := <-taken
			if c[1].end != nil {
				c[1].end(false) // the control's holder never comes back
			}
			if n := count(ctx, standbyURL, "SELECT count(*) FROM tokenguard_refresh_leases"); n != 0 {
				t.Errorf("%d leases reached the standby: the claims came before the cut", n)
			}
			taken <- c
		})
		failedOver <- err
	}()
	time.Sleep(500 * time.Millisecond) // cut off, still running: acknowledged, never sent
	var c [2]claimed
	c[0].end, c[0].err = lease(t, holder, acme)
	c[1].end, c[1].err = lease(t, gone, globex)
	taken <- c
	if err := <-failedOver; err != nil {
		t.Fatal(err)
	}
	c = <-taken
	if c[0].err != nil || c[1].err != nil {
		t.Fatalf("claims on the isolated primary: %v, %v", c[0].err, c[1].err)
	}

	// The promoted server's first claims are held, whatever the leases say.
	for _, tok := range []domain.Token{acme, globex} {
		if _, err := lease(t, other, tok); !errors.Is(err, domain.ErrRefreshInProgress) {
			t.Fatalf("claim of %s on the promoted server at once: err = %v, want ErrRefreshInProgress", tok.Connection, err)
		}
	}
	waitfor.Until(t, 10*time.Second, "the holder never restored its lease", func() bool {
		return count(ctx, p.PrimaryURL(), "SELECT count(*) FROM tokenguard_refresh_leases") == 1
	})
	if n := count(ctx, p.PrimaryURL(), "SELECT count(*) FROM tokenguard_timelines"); n != 2 {
		t.Fatalf("%d timelines recorded, want 2", n)
	}
	if err := execOn(ctx, p.PrimaryURL(), "UPDATE tokenguard_timelines SET since = since - interval '1 hour'"); err != nil {
		t.Fatal(err) // the grace is over
	}
	if _, err := lease(t, other, acme); !errors.Is(err, domain.ErrRefreshInProgress) {
		t.Fatalf("claim of acme after the grace: err = %v, want ErrRefreshInProgress (its restored lease runs)", err)
	}
	endControl, err := lease(t, other, globex)
	if err != nil {
		t.Fatalf("control: claim of globex, whose holder never restored its lease: %v, want it granted", err)
	}
	endControl(true)
	c[0].end(true)
	endOther, err := lease(t, other, acme)
	if err != nil {
		t.Fatalf("claim of acme once its holder released it: %v", err)
	}
	endOther(true)
}

// A rotation the old primary acknowledged but never sent to its asynchronous
// standby is lost by the failover, while the lease under which it was
// presented reached the standby and its holder has stopped renewing it: on
// the promoted server the connection holds the refresh token the provider
// has already rotated. The process that stored the rotation writes it again
// before the timeline's grace is over, so that nobody presents the spent
// token. The control, a process that does not, leaves the spent token to
// the next claim: a reuse at the provider.
func TestRotationLostInAFailoverIsWrittenBack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p, url := startAsyncPair(ctx, t)
	holder := repository.NewTokenRepository(open(t, url), tokencrypt.Plaintext{})
	written := make(chan string, 4)
	holder.OnRotationWrittenBack(func(connection string, lost, found, stored int64) {
		written <- fmt.Sprintf("%s %d %d %d", connection, lost, found, stored)
	})
	control := repository.NewTokenRepository(open(t, url), tokencrypt.Plaintext{})
	control.WriteNothingBack()
	other := repository.NewTokenRepository(open(t, url), tokencrypt.Plaintext{})
	acme := put(t, holder, grantToken("acme", "at-1", "rt-1"))
	globex := put(t, control, grantToken("globex", "at-1", "rt-1"))
	end, err := lease(t, holder, acme) // the first timeline is recorded
	if err != nil {
		t.Fatal(err)
	}
	end(true)
	// The leases reach the standby; the rotations stored under them will not.
	endAcme, errAcme := lease(t, holder, acme)
	endGlobex, errGlobex := lease(t, control, globex)
	if errAcme != nil || errGlobex != nil {
		t.Fatal(errAcme, errGlobex)
	}
	waitfor.Until(t, 30*time.Second, "the standby never received the leases", func() bool {
		return count(ctx, p.StandbyURL(), "SELECT count(*) FROM tokenguard_refresh_leases") == 2
	})

	failedOver := make(chan error, 1)
	go func() {
		_, err := p.Failover(ctx, 2*time.Second, func(ctx context.Context, standbyURL string) {
			if n := count(ctx, standbyURL, "SELECT count(*) FROM tokenguard_tokens WHERE version = 1"); n != 2 {
				t.Errorf("%d of 2 tokens at version 1 on the standby: the rotations came before the cut", n)
			}
		})
		failedOver <- err
	}()
	time.Sleep(500 * time.Millisecond) // cut off, still running: acknowledged, never sent
	for _, s := range []struct {
		r   *repository.TokenRepository
		tok domain.Token
		end func(bool)
	}{{holder, acme, endAcme}, {control, globex, endGlobex}} {
		next := s.tok.Rotated(domain.Grant{AccessToken: domain.NewSecret("at-2"), RefreshToken: domain.NewSecret("rt-2"), Expiry: time.Now().Add(time.Hour)}, time.Now())
		if _, err := s.r.Store(ctx, next); err != nil {
			t.Fatalf("store %s on the isolated primary: %v", s.tok.Connection, err)
		}
		s.end(false) // the refresh is over: its lease is not renewed
	}
	if err := <-failedOver; err != nil {
		t.Fatal(err)
	}

	select {
	case w := <-written:
		if w != "acme 2 1 2" {
			t.Fatalf("written back: %q, want acme 2 1 2", w)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the holder never wrote back the rotation the failover lost")
	}
	if _, err := lease(t, other, acme); !errors.Is(err, domain.ErrConflict) {
		t.Fatalf("claim of acme's spent version after the failover: err = %v, want ErrConflict (its rotation is stored again)", err)
	}
	if err := execOn(ctx, p.PrimaryURL(), "UPDATE tokenguard_timelines SET since = since - interval '1 hour'"); err != nil {
		t.Fatal(err) // the grace of the timeline the first claim recorded is over
	}
	if tok, err := other.Get(ctx, "acme"); err != nil || tok.Version != 2 || tok.RefreshToken.Reveal() != "rt-2" {
		t.Fatalf("acme after the failover: version %d, refresh token %q, %v; want 2, rt-2", tok.Version, tok.RefreshToken.Reveal(), err)
	}
	// The control: once the lease on globex's spent version runs out, the
	// use case records its answer as lost and the version is claimed again.
	if _, err := lease(t, other, globex); !errors.Is(err, domain.ErrRefreshInProgress) {
		t.Fatalf("control: first claim of globex on the promoted server: err = %v, want ErrRefreshInProgress (its lease is held for the grace)", err)
	}
	var seen domain.Token
	waitfor.Until(t, 15*time.Second, "control: globex's lease never ran out", func() bool {
		var l usecase.Lease
		seen, l, err = other.Read(ctx, "globex")
		return err == nil && l.Abandoned
	})
	now := time.Now()
	seen.Failure = domain.RefreshFailure{Failures: 1, Since: now, LastAt: now, RetryAt: now, Code: domain.CodeAnswerLost}
	if err := other.Fail(ctx, seen, seen.Failure); err != nil {
		t.Fatal(err)
	}
	spent, err := lease(t, other, seen)
	if err != nil || seen.Version != 1 || seen.RefreshToken.Reveal() != "rt-1" {
		t.Fatalf("control: claim of globex = %v at version %d with %q; want the spent rt-1 of version 1 leased to the next process",
			err, seen.Version, seen.RefreshToken.Reveal())
	}
	spent(true)
}

// startAsyncPair starts a migrated primary with an asynchronous standby,
// and returns it with the primary's URL.
func startAsyncPair(ctx context.Context, t *testing.T) (*pgserver.Pair, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs Postgres binaries")
	}
	if err := pgserver.PairBinaries(); err != nil {
		t.Skipf("no throw-away primary and standby: %v", err)
	}
	p, err := pgserver.StartPair(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	url := p.URL("postgres")
	if err := migrations.Up(url); err != nil {
		t.Fatal(err)
	}
	return p, url
}

// count runs a count query on the server at url.
func count(ctx context.Context, url, query string) int {
	n := -1
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return n
	}
	defer c.Close(ctx)
	_ = c.QueryRow(ctx, query).Scan(&n)
	return n
}

func execOn(ctx context.Context, url, stmt string) error {
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	_, err = c.Exec(ctx, stmt)
	return err
}
