// Package repository stores connection tokens in Postgres through GORM and
// owns every lock tokenguard takes. It is the only package that writes SQL.
package repository

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/usecase"
)

// TokenRepository reads and writes connection tokens. Plain reads take no lock; writes take it.
type TokenRepository struct {
	db         *gorm.DB
	sealer     Sealer
	leases     *leaseRenewer    // renews the refresh leases this process holds
	durability *Durability      // synchronous_commit of lease and token commits; nil: the server's
	ids        *connIDs         // connection ids by name, for sealing
	keys       sync.Map         // opened DPoP keys by connection id and thumbprint (never changing)
	tokenRate  domain.TokenRate // the OAUTH_* provider's token budget (SetTokenRate)
	// onWrittenBack reports a rotation the database lost, stored again (OnRotationWrittenBack).
	onWrittenBack func(connection string, lost, found, stored int64)
}

// NewTokenRepository binds the repository to a pool; s seals the tokens (tokencrypt.Plaintext: as they are).
func NewTokenRepository(db *gorm.DB, s Sealer) *TokenRepository {
	if s == nil {
		panic("repository: nil Sealer (tokencrypt.Plaintext stores tokens as they are)")
	}
	r := &TokenRepository{db: db, sealer: s, leases: &leaseRenewer{db: db, holders: map[string]*heldLease{}}, ids: &connIDs{}}
	r.leases.restore, r.leases.writeBack = r.restoreLease, r.writeBack
	return r
}

// selectToken reads tokenRows: the token, its connection and its version's failure record, if any.
var selectToken = "SELECT " + selectTokenColumns + tokenFrom

var selectTokenColumns = "c.id AS lock_key, c.name, " + tokenFields("t") + failureColumns

const tokenFrom = ` FROM tokenguard_tokens t JOIN tokenguard_connections c ON c.id = t.connection_id
LEFT JOIN tokenguard_refresh_failures f ON f.connection_id = t.connection_id AND f.version = t.version`

// selectTokenLeased is selectToken with the lease on the version read: whether it runs, its age,
// and whether it ran out unresolved on this server (abandoned: refused anyway, see leaseFree).
var selectTokenLeased = "SELECT " + selectTokenColumns +
	", EXISTS (SELECT FROM tokenguard_refresh_leases l WHERE " + leaseRuns + ") AS leased" +
	", (SELECT greatest(0, (extract(epoch FROM now() - l.taken_at) * 1000)::bigint) FROM tokenguard_refresh_leases l " + leaseOfVersion + ") AS lease_age_ms" +
	", EXISTS (SELECT FROM tokenguard_refresh_leases l " + leaseOfVersion + " AND l.server_started = pg_postmaster_start_time() AND now() > l.until) AS abandoned" + tokenFrom

const leaseOfVersion = `WHERE l.connection_id = t.connection_id AND l.version = t.version`

// tokenColumns are tokenRow's columns of a write's result u: a new version has no failure.
var tokenColumns = "u.lock_key, u.name, " + tokenFields("u") + noFailureColumns

// tokenFields are the columns of token t but its key, name and failure; NULLs read as "".
func tokenFields(t string) string {
	return strings.ReplaceAll("t.access_token, t.refresh_token, "+recordFields, "t.", t+".")
}

// recordFields are tokenFields but the credentials: what a listing shows.
const recordFields = `t.token_type, t.expiry, t.refresh_expiry, t.obtained_at, t.version, t.status, t.status_reason, t.updated_at,
       coalesce(t.granted_account, '') AS account,
       coalesce(array_to_string(t.granted_scopes, ' '), '') AS scopes,
       coalesce(array_to_string(t.missing_scopes, ' '), '') AS missing_scopes,
       coalesce(array_to_string(t.answered_scopes, ' '), '') AS answered,
       coalesce(array_to_string(t.scopes_reduced, ' '), '') AS scopes_reduced,
       coalesce(t.provider, '') AS provider,
       coalesce(t.sealed_version, 0) AS sealed_version,
       coalesce(t.dpop_jkt, '') AS dpop_jkt,
       `

// failureColumns read the refresh failure episode f of the token's version; none reads as zeros.
const failureColumns = `coalesce(f.failures, 0) AS failures, f.since, f.last_at,
       f.retry_at, f.replay_until, coalesce(f.http_status, 0) AS http_status, coalesce(f.code, '') AS code,
       coalesce(f.failing, false) AS failing`

const noFailureColumns = `0 AS failures, NULL::timestamptz AS since, NULL::timestamptz AS last_at,
       NULL::timestamptz AS retry_at, NULL::timestamptz AS replay_until, 0 AS http_status, '' AS code,
       false AS failing`

// Get reads a connection's token without locking: readers never wait on a refresh in progress.
func (r *TokenRepository) Get(ctx context.Context, connection string) (domain.Token, error) {
	return r.get(ctx, r.db, connection)
}

// Read is Get with the lease on the version read, so that a caller about to refresh can wait for it.
func (r *TokenRepository) Read(ctx context.Context, connection string) (domain.Token, usecase.Lease, error) {
	row, err := oneRow[leasedTokenRow](ctx, r.db, "get token", fmt.Errorf("connection %q: %w", connection, domain.ErrNotFound),
		selectTokenLeased+" WHERE c.name = ?", connection)
	if err != nil {
		return domain.Token{}, usecase.Lease{}, err
	}
	r.ids.put(&row.Token)
	t, err := row.Token.domain(r.sealer)
	return t, row.lease(), err
}

// leasedTokenRow is a row of selectTokenLeased.
type leasedTokenRow struct {
	Token      tokenRow `gorm:"embedded"`
	Leased     bool
	LeaseAgeMs sql.NullInt64
	Abandoned  bool
}

func (row leasedTokenRow) lease() usecase.Lease {
	return usecase.Lease{Running: row.Leased, Abandoned: row.Abandoned, Age: millis(row.LeaseAgeMs)}
}

// DefaultPage is how many rows Each reads per query.
const DefaultPage = 500

// Each calls fn with every stored token, by name, a page at a time; fn's error stops it.
func (r *TokenRepository) Each(ctx context.Context, fn func(domain.Token) error) error {
	return eachPage(func(after string) ([]domain.Token, error) {
		return allRows(ctx, r.db, "list tokens", func(row tokenRow) (domain.Token, error) {
			r.ids.put(&row)
			return row.domain(r.sealer)
		}, selectToken+" WHERE c.name > ? ORDER BY c.name LIMIT ?", after, DefaultPage)
	}, func(t domain.Token) string { return t.Connection }, fn)
}

// eachPage calls fn with every row of the pages page reads, each after the key of the previous page's last row.
func eachPage[T any](page func(after string) ([]T, error), key func(T) string, fn func(T) error) error {
	for after := ""; ; {
		rows, err := page(after)
		if err != nil {
			return err
		}
		for _, row := range rows {
			if err := fn(row); err != nil {
				return err
			}
		}
		if len(rows) < DefaultPage {
			return nil
		}
		after = key(rows[len(rows)-1])
	}
}

// Register records a connection name (idempotently): it has a lock key before it has a token.
func (r *TokenRepository) Register(ctx context.Context, connection string) error {
	if err := domain.ValidateName(connection); err != nil {
		return err
	}
	return exec(ctx, r.db, "register connection", "INSERT INTO tokenguard_connections (name) VALUES (?) ON CONFLICT (name) DO NOTHING", connection)
}

// WithAdvisoryLock takes on tx the transaction-scoped advisory locks of the named (registered)
// connections, always in the same order, and gives tx the settings of a locked transaction. The
// wait ends a little before tx's deadline (lock_timeout: domain.ErrLockTimeout), so that a lock
// waited out is told from a store that does not answer.
func (r *TokenRepository) WithAdvisoryLock(tx *gorm.DB, connections ...string) error {
	ids := slices.Compact(slices.Sorted(slices.Values(connections)))
	var set lockSettings // no durability: the server's synchronous_commit
	if r.durability != nil {
		set.syncCommit = r.durability.SyncCommit()
	}
	if d, ok := tx.Statement.Context.Deadline(); ok {
		set.timeout = fmt.Sprintf("%dms", max((time.Until(d)-lockTimeoutMargin).Milliseconds(), 1))
	}
	if len(ids) == 1 {
		return lockConnectionByName(tx, ids[0], set)
	}
	return lockConnectionsByName(tx, ids, set)
}

// InLock runs fn in a transaction holding connection's advisory lock and commits when fn returns
// nil (usecase.ConnectionStore): ctx and wait bound the wait for the lock, hold fn's context.
func (r *TokenRepository) InLock(ctx context.Context, connection string, wait, hold time.Duration,
	fn func(context.Context, usecase.LockedStore) error) error {
	return r.inLock(ctx, connection, wait, hold, func(ctx context.Context, tx *gorm.DB) error {
		return fn(ctx, &LockedTokens{db: tx, repo: r})
	})
}

// LockedTokens is the token store bound to a transaction holding a connection's advisory lock
// (usecase.LockedStore), valid only inside InLock's callback.
type LockedTokens struct {
	db   *gorm.DB // the transaction
	repo *TokenRepository
}

// Get re-reads a token inside the lock.
func (l *LockedTokens) Get(ctx context.Context, connection string) (domain.Token, error) {
	return l.repo.get(ctx, l.db, connection)
}

// endLeases, a CTE of a statement storing version u.version, ends older versions' leases.
const endLeases = `ended AS (DELETE FROM tokenguard_refresh_leases l USING u WHERE l.connection_id = u.lock_key AND l.version < u.version)`

// saveSQL is Store's statement.
var saveSQL = `
WITH u AS (
    UPDATE tokenguard_tokens AS t SET
        access_token = $1, token_type = $2, refresh_token = COALESCE(NULLIF($3, ''), t.refresh_token),
        expiry = $4, refresh_expiry = $5, obtained_at = $6, status = $7, status_reason = $8,
        version = t.version + 1, sealed_version = NULL,
        answered_scopes = $13::text[], scopes_reduced = $14::text[], updated_at = now()
    FROM tokenguard_connections c
    WHERE c.id = t.connection_id AND c.name = $9 AND t.version = $10 AND c.id = $12
    RETURNING c.id AS lock_key, c.name, t.*
),
` + endLeases + `
` + notifiedTokens("$11")

// notifiedTokens selects the rows u written and announces them on channel placeholder p.
func notifiedTokens(p string) string {
	return "SELECT " + tokenColumns + " FROM u, LATERAL pg_notify(" + channelInSchema(p) + ", u.version || ' ' || u.name)"
}

// Put stores a newly granted token for a registered connection, replacing whatever grant it had,
// and announces the change at commit. The version keeps increasing across grants.
func (l *LockedTokens) Put(ctx context.Context, t domain.Token) (domain.Token, error) {
	if t.RefreshToken.IsZero() || t.AccessToken.IsZero() {
		return domain.Token{}, fmt.Errorf("put token of %s: %w: empty access or refresh token", t.Connection, domain.ErrInvalidToken)
	}
	// The version the write gives the row: above a disconnected grant's (tokens_continue_version).
	notFound := fmt.Errorf("put token of %s: %w", t.Connection, domain.ErrNotFound)
	next, err := oneRow[struct {
		ID      int32
		Version int64
	}](ctx, l.db, "put token", notFound, `SELECT c.id, coalesce((SELECT t.version + 1 FROM tokenguard_tokens t WHERE t.connection_id = c.id),
       greatest(c.retired_version + 1, 1)) AS version
FROM tokenguard_connections c WHERE c.name = ?`, t.Connection)
	if err != nil {
		return domain.Token{}, err
	}
	at := seal{next.ID, next.Version}
	if t, err = sealed(l.repo.sealer, t, at); err != nil {
		return domain.Token{}, err
	}
	var rows []tokenRow
	err = l.db.WithContext(ctx).Raw(`
WITH c AS (SELECT id, name FROM tokenguard_connections WHERE name = $1 AND id = $13),
t AS (
    INSERT INTO tokenguard_tokens AS t (connection_id, access_token, token_type, refresh_token, expiry, refresh_expiry, obtained_at, version, status, status_reason,
                             granted_account, granted_scopes, missing_scopes, granted_at, provider, sealed_version)
    SELECT c.id, $2, $3, $4, $5, $6, $7, 1, 'active', '', NULLIF($9, ''), $10::text[], $11::text[], now(),
           NULLIF($12, ''), NULL FROM c
    ON CONFLICT (connection_id) DO UPDATE SET
        sealed_version = NULL, provider = EXCLUDED.provider, granted_account = EXCLUDED.granted_account,
        granted_scopes = EXCLUDED.granted_scopes, missing_scopes = EXCLUDED.missing_scopes,
        answered_scopes = NULL, scopes_reduced = NULL, granted_at = EXCLUDED.granted_at,
        access_token = EXCLUDED.access_token, token_type = EXCLUDED.token_type, refresh_token = EXCLUDED.refresh_token,
        expiry = EXCLUDED.expiry, refresh_expiry = EXCLUDED.refresh_expiry, obtained_at = EXCLUDED.obtained_at,
        status = 'active', status_reason = '', version = t.version + 1, updated_at = now()
    RETURNING t.*
),
u AS (SELECT c.id AS lock_key, c.name, t.* FROM t JOIN c ON c.id = t.connection_id),
`+endLeases+`
`+notifiedTokens("$8"),
		t.Connection, t.AccessToken.Reveal(), t.TokenType, t.RefreshToken.Reveal(), nullTime(t.Expiry), nullTime(t.RefreshExpiry), t.ObtainedAt, ChangeChannel,
		t.Binding.Account, textArray(t.Binding.Scopes), textArray(t.Binding.MissingScopes),
		t.Provider, at.id).Find(&rows).Error
	switch {
	case unknownProvider(err):
		return domain.Token{}, fmt.Errorf("put token of %s: provider %q: %w", t.Connection, t.Provider, domain.ErrUnknownProvider)
	case err != nil:
		return domain.Token{}, storeError(ctx, "put token", err)
	case len(rows) == 0:
		return domain.Token{}, notFound
	}
	if err := putDPoPKey(ctx, l.db, l.repo.sealer, at.id, t.DPoPKey, t.DPoPJKT); err != nil {
		return domain.Token{}, fmt.Errorf("put token of %s: %w", t.Connection, err)
	}
	rows[0].DPoPJKT = t.DPoPJKT
	return rows[0].domain(l.repo.sealer)
}

// get reads connection's token on db, the pool or a locked transaction.
func (r *TokenRepository) get(ctx context.Context, db *gorm.DB, connection string) (domain.Token, error) {
	row, err := oneRow[tokenRow](ctx, db, "get token", fmt.Errorf("connection %q: %w", connection, domain.ErrNotFound),
		selectToken+" WHERE c.name = ?", connection)
	if err != nil {
		return domain.Token{}, err
	}
	r.ids.put(row)
	return row.domain(r.sealer)
}

// The repository is the use case's store.
var (
	_ usecase.TokenStore      = (*TokenRepository)(nil)
	_ usecase.ConnectionStore = (*TokenRepository)(nil)
	_ usecase.AheadStore      = (*TokenRepository)(nil)
	_ usecase.DisconnectStore = (*TokenRepository)(nil)
	_ usecase.LockedStore     = (*LockedTokens)(nil)
)
