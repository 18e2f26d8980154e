package bench_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/internal/testdb"
	"github.com/tokenguard/tokenguard/internal/testworld"
)

// coderPeer is Coder's design for external auth links (coder/coder, as
// indexed in 2026: the migration adding external_auth_links.refresh_lease_expires_at
// and acquire_external_auth_link_refresh_lease, the queries
// AcquireExternalAuthLinkRefreshLease and UpdateExternalAuthLink, and
// externalauth.Config.RefreshToken with its tests in
// coderd/externalauth/externalauth_test.go: WaitsForConcurrentReplicaOK,
// AcquireLeaseAtomicity, OverridesStaleLease):
//
//   - every request reads the link (GetExternalAuthLink) and returns its
//     token unless x/oauth2 would refresh it (expiry within 10 s);
//   - otherwise it takes the lease with one conditional UPDATE …
//     RETURNING (refresh_lease_expires_at NULL or past -> now() + timeout);
//     the winner refreshes unless the returned row already holds another
//     token, and writes the token while clearing its lease;
//   - a loser (the UPDATE matched no row: leased) waits with a backoff
//     (RefreshLeaseInitialBackoff..RefreshLeaseMaxBackoff, whose defaults
//     the indexed sources do not show: 50 ms doubling to 200 ms here, the
//     retry.New(50ms, 200ms) that Config.RefreshToken uses for validation)
//     and reads the row again, until its token changed; if the lease has
//     lapsed meanwhile it tries to take it.
//
// The pool is 20 connections per process.
type coderPeer struct {
	procs []*coderProc
	clock peerClock
	g     gauge
	read  *pgxpool.Pool
}

type coderProc struct {
	peer *coderPeer
	db   *pgxpool.Pool
	cfg  *oauth2.Config
}

const (
	coderExpiryDelta    = 10 * time.Second // x/oauth2's
	coderLeaseTimeout   = 10 * time.Second
	coderInitialBackoff = 50 * time.Millisecond
	coderMaxBackoff     = 200 * time.Millisecond
)

type coderLink struct {
	access, refresh string
	expiry          time.Time
}

func newCoderPeer(tb testing.TB, w *testworld.World, stacks int) *coderPeer {
	tb.Helper()
	p := &coderPeer{}
	dbURL := testdb.NewEmpty(tb)
	p.read = countedPool(tb, dbURL, 2, &gauge{})
	tok := peerGrant(tb, w)
	ctx := context.Background()
	if _, err := p.read.Exec(ctx, `CREATE TABLE external_auth_links (
		provider_id text NOT NULL,
		user_id bigint NOT NULL,
		oauth_access_token text NOT NULL,
		oauth_refresh_token text NOT NULL,
		oauth_expiry timestamptz NOT NULL,
		oauth_refresh_failure_reason text NOT NULL DEFAULT '',
		refresh_lease_expires_at timestamptz,
		updated_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (provider_id, user_id))`); err != nil {
		tb.Fatal(err)
	}
	if _, err := p.read.Exec(ctx, `INSERT INTO external_auth_links (provider_id, user_id, oauth_access_token, oauth_refresh_token, oauth_expiry)
		VALUES ('sandbox', 1, $1, $2, $3)`, tok.AccessToken, tok.RefreshToken, tok.Expiry); err != nil {
		tb.Fatal(err)
	}
	p.clock.issued()
	for range stacks {
		p.procs = append(p.procs, &coderProc{peer: p, db: countedPool(tb, dbURL, 20, &p.g), cfg: w.OAuth})
	}
	return p
}

func (p *coderPeer) watch() func() int64 { return p.g.watch() }

func (p *coderPeer) expire(tb testing.TB) {
	var exp time.Time
	if err := p.read.QueryRow(context.Background(), `SELECT oauth_expiry FROM external_auth_links WHERE provider_id = 'sandbox' AND user_id = 1`).Scan(&exp); err != nil {
		tb.Fatal(err)
	}
	p.clock.pass(exp.Add(-coderExpiryDelta))
}

func (s *coderProc) getLink(ctx context.Context) (coderLink, error) {
	var l coderLink
	err := s.db.QueryRow(ctx, `SELECT oauth_access_token, oauth_refresh_token, oauth_expiry FROM external_auth_links
		WHERE provider_id = 'sandbox' AND user_id = 1`).Scan(&l.access, &l.refresh, &l.expiry)
	return l, err
}

func (s *coderProc) valid(l coderLink) bool {
	return l.expiry.Add(-coderExpiryDelta).After(s.peer.clock.Now())
}

func (p *coderPeer) call(ctx context.Context, i int) error {
	s := p.procs[i]
	l, err := s.getLink(ctx)
	if err != nil {
		return err
	}
	if s.valid(l) {
		return nil
	}
	return s.refreshToken(ctx, l)
}

// refreshToken is Config.RefreshToken for an expired link.
func (s *coderProc) refreshToken(ctx context.Context, seen coderLink) error {
	backoff := coderInitialBackoff
	for {
		var (
			l     coderLink
			lease time.Time
		)
		err := s.db.QueryRow(ctx, `UPDATE external_auth_links SET refresh_lease_expires_at = now() + $1::interval
			WHERE provider_id = 'sandbox' AND user_id = 1
			  AND (refresh_lease_expires_at IS NULL OR refresh_lease_expires_at < now())
			RETURNING oauth_access_token, oauth_refresh_token, oauth_expiry, refresh_lease_expires_at`, coderLeaseTimeout).
			Scan(&l.access, &l.refresh, &l.expiry, &lease)
		switch {
		case err == nil:
			return s.refreshUnderLease(ctx, seen, l, lease)
		case !errors.Is(err, pgx.ErrNoRows):
			return err
		}
		// Leased by another replica: wait, then see whether it is done.
		for {
			time.Sleep(backoff)
			backoff = min(2*backoff, coderMaxBackoff)
			var (
				access string
				leased bool
			)
			if err := s.db.QueryRow(ctx, `SELECT oauth_access_token, refresh_lease_expires_at IS NOT NULL AND refresh_lease_expires_at >= now()
				FROM external_auth_links WHERE provider_id = 'sandbox' AND user_id = 1`).Scan(&access, &leased); err != nil {
				return err
			}
			if access != seen.access {
				return nil
			}
			if !leased {
				break // the holder is gone: try to take the lease
			}
		}
	}
}

func (s *coderProc) refreshUnderLease(ctx context.Context, seen, l coderLink, lease time.Time) error {
	release := func() error {
		_, err := s.db.Exec(context.WithoutCancel(ctx), `UPDATE external_auth_links SET refresh_lease_expires_at = NULL
			WHERE provider_id = 'sandbox' AND user_id = 1 AND refresh_lease_expires_at = $1`, lease)
		return err
	}
	if l.access != seen.access || s.valid(l) {
		return release() // another replica refreshed before we got the lease
	}
	tok, err := refreshWith(ctx, s.cfg, l.refresh)
	if err != nil {
		return errors.Join(err, release())
	}
	tag, err := s.db.Exec(context.WithoutCancel(ctx), `UPDATE external_auth_links SET oauth_access_token = $1, oauth_refresh_token = $2,
		oauth_expiry = $3, updated_at = now(), refresh_lease_expires_at = NULL
		WHERE provider_id = 'sandbox' AND user_id = 1 AND refresh_lease_expires_at = $4`, tok.AccessToken, tok.RefreshToken, tok.Expiry, lease)
	if err == nil && tag.RowsAffected() != 1 {
		err = errors.New("coder: lease lost before the write")
	}
	return err
}

func (p *coderPeer) rest() {
	for _, proc := range p.procs {
		resetPools(proc.db)
	}
}
