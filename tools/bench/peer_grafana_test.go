package bench_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/internal/testdb"
	"github.com/tokenguard/tokenguard/internal/testworld"
)

// grafanaPeer is Grafana's design (grafana/grafana, pkg/services/oauthtoken
// and pkg/infra/serverlock, as indexed in 2026):
//
//   - every request reads the user's auth row
//     (oauthtoken.Service.GetCurrentOAuthToken -> hasOAuthEntry ->
//     AuthInfoService.GetAuthInfo) and returns the token unless it expires
//     within ExpiryDelta (10 s, needTokenRefresh);
//   - otherwise TryTokenRefresh runs the refresh inside
//     ServerLockService.LockExecuteAndReleaseWithRetries with
//     MinWait = OAuthRefreshTokenServerLockMinWaitMs (50 ms here) and
//     MaxWait = MinWait + 500 ms, and gives up after 5 tries
//     (ErrRetriesExhausted; the request then goes on without a token);
//   - the lock is a row of server_lock: acquireForRelease, in a
//     transaction, reads the row FOR UPDATE (get_lock_for_update.sql) and
//     fails while its last_execution is within MaxInterval (30 s), takes
//     over an older one, or inserts it (create_lock.sql, ON CONFLICT DO
//     NOTHING RETURNING id, unique operation_uid); a try that fails sleeps
//     a random wait in [MinWait, MaxWait) (lockWait);
//   - under the lock it re-reads the auth row, refreshes only if still due
//     (tryGetOrRefreshOAuthToken, x/oauth2's TokenSource), updates the row
//     (UpdateAuthInfo), and releaseLock deletes the lock row.
//
// No in-process deduplication: the singleflight of older versions gave way
// to the server lock. The pool is 20 connections per process.
type grafanaPeer struct {
	procs []*grafanaProc
	clock peerClock
	g     gauge
	read  *pgxpool.Pool
}

type grafanaProc struct {
	peer *grafanaPeer
	db   *pgxpool.Pool
	cfg  *oauth2.Config
}

const (
	grafanaExpiryDelta = 10 * time.Second
	grafanaMinWait     = 50 * time.Millisecond
	grafanaMaxWait     = grafanaMinWait + 500*time.Millisecond
	grafanaMaxInterval = 30 * time.Second
	grafanaLockKey     = "oauth-refresh-token-1"
)

var (
	errGrafanaLockExists       = errors.New("grafana: server lock exists")
	errGrafanaRetriesExhausted = errors.New("grafana: retries exhausted")
)

func newGrafanaPeer(tb testing.TB, w *testworld.World, stacks int) *grafanaPeer {
	tb.Helper()
	p := &grafanaPeer{}
	dbURL := testdb.NewEmpty(tb)
	p.read = countedPool(tb, dbURL, 2, &gauge{})
	tok := peerGrant(tb, w)
	ctx := context.Background()
	for _, q := range []string{
		`CREATE TABLE user_auth (
			id serial PRIMARY KEY,
			user_id bigint NOT NULL UNIQUE,
			auth_module text NOT NULL,
			o_auth_access_token text NOT NULL,
			o_auth_refresh_token text NOT NULL,
			o_auth_token_type text NOT NULL,
			o_auth_expiry timestamptz NOT NULL)`,
		`CREATE TABLE server_lock (
			id serial PRIMARY KEY,
			operation_uid varchar(100) NOT NULL UNIQUE,
			version bigint NOT NULL,
			last_execution bigint NOT NULL)`,
	} {
		if _, err := p.read.Exec(ctx, q); err != nil {
			tb.Fatal(err)
		}
	}
	if _, err := p.read.Exec(ctx, `INSERT INTO user_auth (user_id, auth_module, o_auth_access_token, o_auth_refresh_token, o_auth_token_type, o_auth_expiry)
		VALUES (1, 'oauth_generic_oauth', $1, $2, $3, $4)`, tok.AccessToken, tok.RefreshToken, tok.Type(), tok.Expiry); err != nil {
		tb.Fatal(err)
	}
	p.clock.issued()
	for range stacks {
		p.procs = append(p.procs, &grafanaProc{peer: p, db: countedPool(tb, dbURL, 20, &p.g), cfg: w.OAuth})
	}
	return p
}

func (p *grafanaPeer) watch() func() int64 { return p.g.watch() }

func (p *grafanaPeer) expire(tb testing.TB) {
	var exp time.Time
	if err := p.read.QueryRow(context.Background(), `SELECT o_auth_expiry FROM user_auth WHERE user_id = 1`).Scan(&exp); err != nil {
		tb.Fatal(err)
	}
	p.clock.pass(exp.Add(-grafanaExpiryDelta))
}

type grafanaAuth struct {
	access, refresh string
	expiry          time.Time
}

func (s *grafanaProc) getAuthInfo(ctx context.Context) (grafanaAuth, error) {
	var a grafanaAuth
	err := s.db.QueryRow(ctx, `SELECT o_auth_access_token, o_auth_refresh_token, o_auth_expiry FROM user_auth WHERE user_id = 1`).
		Scan(&a.access, &a.refresh, &a.expiry)
	return a, err
}

func (s *grafanaProc) needTokenRefresh(a grafanaAuth) bool {
	return a.expiry.Add(-grafanaExpiryDelta).Before(s.peer.clock.Now())
}

// call is GetCurrentOAuthToken.
func (p *grafanaPeer) call(ctx context.Context, i int) error {
	s := p.procs[i]
	a, err := s.getAuthInfo(ctx)
	if err != nil {
		return err
	}
	if !s.needTokenRefresh(a) {
		return nil
	}
	return s.tryTokenRefresh(ctx)
}

func (s *grafanaProc) tryTokenRefresh(ctx context.Context) error {
	var cmdErr error
	lockErr := s.lockExecuteAndReleaseWithRetries(ctx, grafanaLockKey, func(ctx context.Context) {
		a, err := s.getAuthInfo(ctx)
		if err != nil {
			cmdErr = err
			return
		}
		if !s.needTokenRefresh(a) {
			return
		}
		tok, err := refreshWith(ctx, s.cfg, a.refresh)
		if err != nil {
			cmdErr = err
			return
		}
		_, cmdErr = s.db.Exec(ctx, `UPDATE user_auth SET o_auth_access_token = $1, o_auth_refresh_token = $2,
			o_auth_token_type = $3, o_auth_expiry = $4 WHERE user_id = 1`, tok.AccessToken, tok.RefreshToken, tok.Type(), tok.Expiry)
	})
	if lockErr != nil {
		return lockErr
	}
	return cmdErr
}

func (s *grafanaProc) lockExecuteAndReleaseWithRetries(ctx context.Context, action string, fn func(context.Context)) error {
	for checks := 1; ; checks++ {
		err := s.acquireForRelease(ctx, action)
		if err == nil {
			break
		}
		if !errors.Is(err, errGrafanaLockExists) {
			return err
		}
		if checks >= 5 {
			return errGrafanaRetriesExhausted
		}
		time.Sleep(grafanaMinWait + rand.N(grafanaMaxWait-grafanaMinWait))
	}
	fn(ctx)
	_, err := s.db.Exec(context.WithoutCancel(ctx), `DELETE FROM server_lock WHERE operation_uid = $1`, action)
	return err
}

func (s *grafanaProc) acquireForRelease(ctx context.Context, action string) error {
	return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		var id int64
		var last int64
		err := tx.QueryRow(ctx, `SELECT id, last_execution FROM server_lock WHERE operation_uid = $1 FOR UPDATE`, action).Scan(&id, &last)
		switch {
		case err == nil:
			if last != 0 && time.Since(time.Unix(last, 0)) < grafanaMaxInterval {
				return errGrafanaLockExists
			}
			_, err = tx.Exec(ctx, `UPDATE server_lock SET last_execution = $1 WHERE operation_uid = $2`, time.Now().Unix(), action)
			return err
		case errors.Is(err, pgx.ErrNoRows):
			err = tx.QueryRow(ctx, `INSERT INTO server_lock (operation_uid, last_execution, version) VALUES ($1, $2, 0)
				ON CONFLICT DO NOTHING RETURNING id`, action, time.Now().Unix()).Scan(&id)
			if errors.Is(err, pgx.ErrNoRows) {
				return errGrafanaLockExists // inserted by another server since the SELECT
			}
			return err
		default:
			return err
		}
	})
}

func (p *grafanaPeer) rest() {
	for _, proc := range p.procs {
		resetPools(proc.db)
	}
}
