package repository

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/usecase"
)

// The refresh path's transactions (usecase.TokenStore), Claim, Store and Fail, each lock, do one
// thing and commit, so that no connection is held across a call to the provider.

// Claim leases the refresh of seen for answerWithin if, under the lock, the token is still seen
// (version and failure record), active, and no other holder's request for that version is
// unresolved. This process renews the lease until Claim.End is called.
func (r *TokenRepository) Claim(ctx context.Context, seen domain.Token, answerWithin time.Duration) (usecase.Claim, error) {
	row, holder, err := r.claim(ctx, seen, answerWithin)
	if err == nil && row.Timeline == timelineNew {
		// The first claim on this timeline records it, and asks again.
		err = storeError(ctx, "record the server's timeline",
			r.db.WithContext(ctx).Exec("INSERT INTO tokenguard_timelines (timeline) SELECT "+timelineID+" ON CONFLICT DO NOTHING").Error)
		if err == nil {
			row, holder, err = r.claim(ctx, seen, answerWithin)
		}
	}
	if err != nil {
		return usecase.Claim{}, err
	}
	c := usecase.Claim{Token: row.token, Lease: row.Read.lease()}
	if w := row.BudgetWaitMs; w != nil && row.Took == nil {
		c.BudgetWait = max(time.Duration(*w)*time.Millisecond, time.Millisecond)
	}
	switch took := row.Took; {
	case took != nil && *took == holder:
		lease := &heldLease{renewer: r.leases, connection: seen.Connection, version: seen.Version,
			failures: seen.Failure.Failures, taken: time.Now(), holder: holder, presented: row.token.RefreshToken}
		r.leases.add(lease)
		c.End, c.Why = lease.end, lease.note
	case took != nil:
		// A lease taken on another server (a restart, a failover), held for its holder for the grace.
		c.Lease.Running = true
	case row.Timeline != timelineSettled && !c.Lease.Abandoned && c.Token.Version == seen.Version &&
		c.Token.Failure.Failures == seen.Failure.Failures && c.Token.Status == domain.StatusActive:
		// A new timeline: leases the old primary did not send may be at the provider.
		c.Lease.Running = true
	}
	return c, nil
}

// claim runs claimSQL under the lock, with holder the lease's holder if it takes one.
func (r *TokenRepository) claim(ctx context.Context, seen domain.Token, answerWithin time.Duration) (*claimRow, string, error) {
	var row *claimRow
	holder := uuid.NewString() // the statement taking the lease tells whose lease it returns
	err := r.inLock(ctx, seen.Connection, 0, lockedHold, func(ctx context.Context, tx *gorm.DB) error {
		var err error
		row, err = oneRow[claimRow](ctx, tx, "claim refresh of "+seen.Connection, fmt.Errorf("connection %q: %w", seen.Connection, domain.ErrNotFound),
			claimSQL, seen.Connection, seen.Version, holder, (max(answerWithin, 0) + leaseTerm).Milliseconds(),
			restartGrace.Milliseconds(), seen.Failure.Failures, string(domain.StatusActive),
			r.tokenRate.Limit, r.tokenRate.Period.Milliseconds(), usecase.SpareBudgetOnly(ctx))
		if err != nil {
			return err
		}
		// Opened before the commit: a token that cannot be rolls the lease back with it.
		row.token, err = row.Read.Token.domain(r.sealer)
		return err
	})
	if err != nil {
		return nil, "", err
	}
	r.ids.put(&row.Read.Token)
	return row, holder, nil
}

// timelineID is the server's WAL timeline: a promotion or a restore from backup starts a new one.
const timelineID = "('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::int"

// A claim's timeline: new (not recorded yet: no lease), held (recorded less than the grace ago,
// following another: no lease) or settled.
const (
	timelineNew     = "new"
	timelineHeld    = "held"
	timelineSettled = "settled"
)

// claimSQL re-reads connection $1's token with its lease and leases version $2 for holder $3 for
// $4 ms (a lease from another server kept for the grace $5 ms), if the token still has $6
// failures, is $7 (active), no other holder's request is unresolved and the timeline is settled;
// took is the lease's holder afterwards, NULL when none was asked for. Where the provider has a
// token budget (stored, or $8 requests in $9 ms for OAUTH_*), the lease comes only with a debit of
// it; budget_wait_ms says, when the budget refused, how long until it may not (at least 1 ms).
// $10: the sweep's claim, which leaves a reserve to callers.
var claimSQL = `WITH timeline AS (
    SELECT coalesce((SELECT CASE WHEN tl.since + $5 * interval '1 millisecond' > now()
                                  AND EXISTS (SELECT FROM tokenguard_timelines o WHERE o.timeline < tl.timeline)
                             THEN '` + timelineHeld + `' ELSE '` + timelineSettled + `' END
                     FROM tokenguard_timelines tl WHERE tl.timeline = ` + timelineID + `), '` + timelineNew + `') AS state
),
cur AS (
    SELECT s.*, timeline.state AS timeline,
           s.version = $2 AND s.failures = $6 AND s.status = $7 AND NOT s.leased AND NOT s.abandoned
           AND timeline.state = '` + timelineSettled + `' AS claimable
    FROM (` + selectTokenLeased + ` WHERE c.name = $1) s, timeline
),
` + budgetSQL + `,
took AS (
    INSERT INTO tokenguard_refresh_leases AS l (connection_id, version, holder, until, server_started)
    SELECT cur.lock_key, cur.version, $3::uuid, now() + $4 * interval '1 millisecond', pg_postmaster_start_time() FROM cur
    WHERE cur.claimable AND (NOT EXISTS (SELECT FROM rate WHERE rate.lim > 0) OR EXISTS (SELECT FROM budget))
    ` + leaseUpsert + `
)
SELECT cur.*, (SELECT holder FROM took) AS took,
       (SELECT greatest(1, ceil(extract(epoch FROM greatest(
            coalesce(b.shrunk_until, '-infinity'),
            coalesce((SELECT s FROM unnest(b.spent) s WHERE s > clock_timestamp() - rate.win
                      ORDER BY s DESC OFFSET rate.allowed - 1 LIMIT 1) + rate.win, clock_timestamp())
          ) - clock_timestamp()) * 1000))::bigint
        FROM rate LEFT JOIN tokenguard_token_budgets b ON b.provider = rate.key
        WHERE rate.lim > 0 AND NOT EXISTS (SELECT FROM budget)) AS budget_wait_ms
FROM cur`

// budgetSQL are claimSQL's budget steps. rate: lim requests in any window of win, of which the
// claim may count allowed (the sweep leaves a quarter, at least one, to callers); the window is
// a twentieth longer than the period, for the network's jitter. budget debits it, or returns no
// row when it is spent or shrunk (ShrinkBudget). Claims of one provider queue on its row.
const budgetSQL = `rate AS (
    SELECT cur.provider AS key, r.lim, r.per * interval '1.05 millisecond' AS win,
           CASE WHEN $10::boolean THEN r.lim - least(r.lim - 1, (r.lim + 3) / 4) ELSE r.lim END AS allowed
    FROM cur LEFT JOIN tokenguard_providers p ON p.name = cur.provider AND cur.provider <> '',
         LATERAL (SELECT CASE WHEN cur.provider = '' THEN $8::integer ELSE coalesce(p.token_rate_limit, 0) END AS lim,
                         CASE WHEN cur.provider = '' THEN $9::bigint ELSE coalesce(p.token_rate_period_ms, 0) END AS per) r
    WHERE cur.claimable
),
budget AS (
    INSERT INTO tokenguard_token_budgets AS b (provider, spent)
    SELECT rate.key, ARRAY[clock_timestamp()] FROM rate WHERE rate.lim > 0
    ON CONFLICT (provider) DO UPDATE SET
        spent = ARRAY(SELECT s FROM unnest(b.spent) s WHERE s > clock_timestamp() - (SELECT win FROM rate) ORDER BY s) || clock_timestamp()
    WHERE (b.shrunk_until IS NULL OR b.shrunk_until <= clock_timestamp())
      AND (SELECT count(*) FROM unnest(b.spent) s WHERE s > clock_timestamp() - (SELECT win FROM rate)) < (SELECT allowed FROM rate)
    RETURNING true AS ok
)`

// claimRow is a row of claimSQL.
type claimRow struct {
	Read         leasedTokenRow `gorm:"embedded"`
	Timeline     string
	Took         *string
	BudgetWaitMs *int64
	token        domain.Token // Read's, opened
}

// SetTokenRate sets the OAUTH_* provider's token budget (zero: none); call it before use.
func (r *TokenRepository) SetTokenRate(rate domain.TokenRate) { r.tokenRate = rate }

// ShrinkBudget spends what is left of provider's token budget ("": OAUTH_*) for d, fleet-wide,
// after a 429 with Retry-After d. A provider without a budget row is left alone.
func (r *TokenRepository) ShrinkBudget(ctx context.Context, provider string, d time.Duration) (bool, error) {
	res := r.db.WithContext(ctx).Exec(`UPDATE tokenguard_token_budgets
SET shrunk_until = greatest(coalesce(shrunk_until, '-infinity'), clock_timestamp() + ? * interval '1 millisecond')
WHERE provider = ?`, max(d, 0).Milliseconds(), provider)
	op := "shrink the token budget of " + cmp.Or(provider, domain.ReservedProviderName)
	return res.RowsAffected > 0, storeError(ctx, op, res.Error)
}

// Store writes t over the stored token if it is still at t.Version (else domain.ErrConflict),
// bumps the version, ends older leases and announces the change, in one statement under the
// lock. An empty refresh token keeps the stored one.
func (r *TokenRepository) Store(ctx context.Context, t domain.Token) (domain.Token, error) {
	var out domain.Token
	err := r.inLock(ctx, t.Connection, 0, lockedHold, func(ctx context.Context, tx *gorm.DB) error {
		if t.RefreshToken.IsZero() {
			// The kept refresh token is sealed again with the new version.
			cur, err := r.get(ctx, tx, t.Connection)
			if err != nil {
				return err
			}
			t.RefreshToken = cur.RefreshToken
		}
		row, err := r.writeNext(ctx, tx, "save token", t, saveSQL, func(st domain.Token, id int32) []any {
			return []any{st.AccessToken.Reveal(), st.TokenType, st.RefreshToken.Reveal(), nullTime(st.Expiry),
				nullTime(st.RefreshExpiry), st.ObtainedAt, string(st.Status), st.StatusReason, st.Connection, st.Version, ChangeChannel,
				id, textArray(st.Binding.Answered), textArray(st.Binding.ScopesReduced)}
		})
		if err != nil {
			return err
		}
		out, err = row.domain(r.sealer)
		return err
	})
	if err == nil {
		r.leases.keep(t, out.Version)
	}
	return out, err
}

// writeNext runs, under t's lock, the statement sql writing t's next version, with the arguments
// args makes of t sealed for that version and of the connection's id. A row no longer at
// t.Version, or whose id changed, is domain.ErrConflict.
func (r *TokenRepository) writeNext(ctx context.Context, tx *gorm.DB, op string, t domain.Token, sql string,
	args func(st domain.Token, id int32) []any) (*tokenRow, error) {
	id, err := r.ids.lookup(ctx, tx, t.Connection)
	if err != nil {
		return nil, err
	}
	st, err := sealed(r.sealer, t, seal{id: id, version: t.Version + 1})
	if err != nil {
		return nil, err
	}
	row, err := oneRow[tokenRow](ctx, tx, op, nil, sql, args(st, id)...)
	if err == nil && row == nil {
		r.ids.forget(t.Connection) // or the id changed: read again by the next write
		err = fmt.Errorf("%s of %s at version %d: %w", op, t.Connection, t.Version, domain.ErrConflict)
	}
	return row, err
}

// failSQL records the failure episode of version $2 of connection $1, ends that version's lease
// and announces the unchanged version, so that waiting processes look again at once. $12 is
// why, as Claim.Why noted it, for the history.
var failSQL = `
WITH f AS (
    INSERT INTO tokenguard_refresh_failures AS f
        (connection_id, version, failures, since, last_at, retry_at, replay_until, http_status, code, failing)
    SELECT t.connection_id, t.version, $3, $4, $5, $6, $7, $8, $9, $10
    FROM tokenguard_tokens t JOIN tokenguard_connections c ON c.id = t.connection_id
    WHERE c.name = $1 AND t.version = $2
    ON CONFLICT (connection_id) DO UPDATE SET
        version = EXCLUDED.version, failures = EXCLUDED.failures, since = EXCLUDED.since,
        last_at = EXCLUDED.last_at, retry_at = EXCLUDED.retry_at, replay_until = EXCLUDED.replay_until,
        http_status = EXCLUDED.http_status, code = EXCLUDED.code, failing = EXCLUDED.failing
    RETURNING f.connection_id, f.version
),
why AS (SELECT set_config('tokenguard.lease_reason', $12, true) AS why),
ended AS (DELETE FROM tokenguard_refresh_leases l USING f WHERE l.connection_id = f.connection_id AND l.version = f.version
    AND EXISTS (SELECT FROM why))
SELECT f.version::text FROM f, LATERAL pg_notify(` + channelInSchema("$11") + `, f.version || ' ' || $1::text)`

// Fail records for t's version the failure episode f (the backoff every process honours) and
// ends its lease; domain.ErrConflict, writing nothing, when the stored version moved on.
func (r *TokenRepository) Fail(ctx context.Context, t domain.Token, f domain.RefreshFailure) error {
	return r.inLock(ctx, t.Connection, 0, lockedHold, func(ctx context.Context, tx *gorm.DB) error {
		_, err := oneRow[string](ctx, tx, "record refresh failure of "+t.Connection,
			fmt.Errorf("record refresh failure of %s at version %d: %w", t.Connection, t.Version, domain.ErrConflict),
			failSQL, t.Connection, t.Version, f.Failures, f.Since, f.LastAt, nullTime(f.RetryAt), nullTime(f.ReplayUntil),
			f.HTTPStatus, f.Code, f.Failing, ChangeChannel, r.leases.whyOf(t.Connection, t.Version))
		return err
	})
}
