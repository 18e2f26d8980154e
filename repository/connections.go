package repository

import (
	"gorm.io/gorm"

	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// selectConnection reads connectionRows: what a listing shows, and no
// credential (the token columns are never read, so a listing neither
// decrypts nor can leak one).
var selectConnection = `
SELECT c.name, coalesce(t.provider, '') AS provider,
       t.status, t.status_reason, t.expiry, t.refresh_expiry, t.obtained_at, t.version, t.updated_at,
       coalesce(t.granted_account, '') AS granted_account,
       coalesce(array_to_string(t.granted_scopes, ' '), '') AS granted_scopes,
       coalesce(array_to_string(t.missing_scopes, ' '), '') AS missing_scopes,
       coalesce(array_to_string(t.scopes_reduced, ' '), '') AS scopes_reduced,
       c.metadata::text AS metadata, array_to_json(c.tags)::text AS tags,
       ` + failureColumns + `,
       coalesce(t.dpop_jkt, '') AS dpop_jkt
FROM tokenguard_tokens t JOIN tokenguard_connections c ON c.id = t.connection_id
LEFT JOIN tokenguard_refresh_failures f ON f.connection_id = t.connection_id AND f.version = t.version`

type connectionRow struct {
	Name           string
	Provider       string
	Status         string
	StatusReason   string
	Expiry         sql.NullTime
	RefreshExpiry  sql.NullTime
	ObtainedAt     time.Time
	Version        int64
	UpdatedAt      time.Time
	GrantedAccount string
	GrantedScopes  string
	MissingScopes  string
	ScopesReduced  string
	Metadata       string
	Tags           string // a JSON array
	// The refresh failure episode of this version (failureColumns).
	Failures      int
	FailureSince  sql.NullTime
	FailureLast   sql.NullTime
	RetryAt       sql.NullTime
	ReplayUntil   sql.NullTime
	FailureStatus int
	FailureCode   string
	Failing       bool
	DPoPJKT       string `gorm:"column:dpop_jkt"`
}

func (r connectionRow) domain() domain.Connection {
	m := domain.Metadata{Object: compactJSON(r.Metadata)}
	_ = json.Unmarshal([]byte(r.Tags), &m.Tags) // array_to_json of text[]: always an array
	if len(m.Tags) == 0 {
		m.Tags = nil
	}
	status, reason := domain.Status(r.Status), r.StatusReason
	f := failureOf(r.Failures, r.FailureSince, r.FailureLast, r.RetryAt, r.ReplayUntil, r.FailureStatus, r.FailureCode, r.Failing)
	if f.Failing && status == domain.StatusActive {
		status, reason = domain.StatusFailing, f.Describe()
	}
	return domain.Connection{
		Name:          r.Name,
		Provider:      r.Provider,
		Status:        status,
		StatusReason:  reason,
		Failure:       f,
		Expiry:        r.Expiry.Time,
		RefreshExpiry: r.RefreshExpiry.Time,
		ObtainedAt:    r.ObtainedAt,
		Version:       r.Version,
		UpdatedAt:     r.UpdatedAt,
		Binding:       domain.Binding{Account: r.GrantedAccount, Scopes: r.GrantedScopes, MissingScopes: r.MissingScopes, ScopesReduced: r.ScopesReduced},
		Metadata:      m,
		DPoPJKT:       r.DPoPJKT,
	}
}

// ConnectionsPage lists up to limit connections that have a token, whose
// names sort after after ("" for the first page), in byte order of the
// name (the same under every database collation): keyset pagination on
// the index tokenguard_connections_name_bytes. No credential is read.
func (r *TokenRepository) ConnectionsPage(ctx context.Context, after string, limit int) ([]domain.Connection, error) {
	return r.FilteredConnectionsPage(ctx, domain.ConnectionFilter{}, after, limit)
}

// FilteredConnectionsPage is ConnectionsPage with only the connections f
// matches, in one statement that reads about what it returns: the same
// keyset page, a name prefix starting the range scan at the prefix, and
// the key's patterns (f.Patterns) as ranges of the name index, one per
// pattern, each stopping at limit rows (domain.ConnectionScan). A pattern
// that begins with a wildcard has no range: its page reads the names
// after after until limit match.
func (r *TokenRepository) FilteredConnectionsPage(ctx context.Context, f domain.ConnectionFilter, after string, limit int) ([]domain.Connection, error) {
	scans, all := domain.KeyAccess{Connections: f.Patterns}.ConnectionScans()
	if !all && len(scans) == 0 {
		return nil, nil // the key's patterns match no name
	}
	where, args := []string{`c.name COLLATE "C" > ?`}, []any{after}
	switch f.Status {
	case "":
	case domain.StatusExpiringSoon:
		where = append(where, "t.status = 'active' AND t.refresh_expiry < now() + ? * interval '1 second'")
		args = append(args, int64(domain.ExpiringSoonWithin/time.Second))
	default:
		where = append(where, "t.status = ?")
		args = append(args, string(f.Status))
	}
	switch f.Provider {
	case "":
	case domain.EnvProvider:
		where = append(where, "t.provider IS NULL")
	default:
		where = append(where, "t.provider = ?")
		args = append(args, f.Provider)
	}
	if f.Tag != "" {
		where = append(where, "c.tags @> ARRAY[?]::text[]")
		args = append(args, f.Tag)
	}
	if f.NamePrefix != "" {
		where = append(where, `c.name COLLATE "C" >= ? AND starts_with(c.name, ?)`)
		args = append(args, f.NamePrefix, f.NamePrefix)
	}
	const page = ` ORDER BY c.name COLLATE "C" LIMIT ?`
	q, qargs := selectConnection+" WHERE "+strings.Join(where, " AND ")+page, append(args, limit)
	if !all {
		// One page per pattern, merged: each reads at most limit rows of
		// its range; a name two patterns match is listed once (UNION).
		branches := make([]string, len(scans))
		qargs = nil
		for i, s := range scans {
			cond, cargs := scanCondition(s)
			branches[i] = "(" + selectConnection + " WHERE " + strings.Join(where, " AND ") + " AND " + cond + page + ")"
			qargs = append(append(append(qargs, args...), cargs...), limit)
		}
		q = `SELECT * FROM (` + strings.Join(branches, " UNION ") + `) p ORDER BY p.name COLLATE "C" LIMIT ?`
		qargs = append(qargs, limit)
	}
	var rows []connectionRow
	if err := r.db.WithContext(ctx).Raw(q, qargs...).Find(&rows).Error; err != nil {
		return nil, storeError(ctx, "list connections", err)
	}
	out := make([]domain.Connection, len(rows))
	for i, row := range rows {
		out[i] = row.domain()
	}
	return out, nil
}

// scanCondition is the SQL condition of a pattern's scan: the name itself,
// or the range of names its literal prefix starts in byte order (the
// prefix up to the prefix with its last byte raised by one), then the
// pattern's regular expression, in byte order too.
func scanCondition(s domain.ConnectionScan) (string, []any) {
	if s.Exact {
		return "c.name = ?", []any{s.Prefix}
	}
	var cond []string
	var args []any
	if s.Prefix != "" {
		// Patterns are printable ASCII: the last byte raised stays below 0x80.
		upper := s.Prefix[:len(s.Prefix)-1] + string(rune(s.Prefix[len(s.Prefix)-1]+1))
		cond = append(cond, `c.name COLLATE "C" >= ? AND c.name COLLATE "C" < ?`)
		args = append(args, s.Prefix, upper)
	}
	if s.Regexp != "" {
		cond = append(cond, `c.name COLLATE "C" ~ ?`)
		args = append(args, s.Regexp)
	}
	return strings.Join(cond, " AND "), args
}

// EachConnection calls fn with every connection that has a token, in name
// order, reading DefaultPage rows at a time. fn's error stops it.
func (r *TokenRepository) EachConnection(ctx context.Context, fn func(domain.Connection) error) error {
	for after := ""; ; {
		page, err := r.ConnectionsPage(ctx, after, DefaultPage)
		if err != nil {
			return err
		}
		for _, c := range page {
			if err := fn(c); err != nil {
				return err
			}
		}
		if len(page) < DefaultPage {
			return nil
		}
		after = page[len(page)-1].Name
	}
}

// Connection reads one connection as listings show it; domain.ErrNotFound
// when it has no token.
func (r *TokenRepository) Connection(ctx context.Context, connection string) (domain.Connection, error) {
	var rows []connectionRow
	if err := r.db.WithContext(ctx).Raw(selectConnection+" WHERE c.name = ?", connection).Find(&rows).Error; err != nil {
		return domain.Connection{}, storeError(ctx, "read connection", err)
	}
	if len(rows) == 0 {
		return domain.Connection{}, fmt.Errorf("connection %q: %w", connection, domain.ErrNotFound)
	}
	return rows[0].domain(), nil
}

// maxProviderField bounds a value kept from a provider's answer.
const maxProviderField = 2048

// SetProviderFields replaces the "provider_fields" object of the
// connection's metadata with fields (the rest of the metadata is left as
// it is), inside the locked transaction like SetMetadata. A value longer
// than 2 KiB is refused with domain.ErrInvalidMetadata.
func (l *LockedTokens) SetProviderFields(ctx context.Context, connection string, fields map[string]string) error {
	for k, v := range fields {
		if len(k) > 64 || len(v) > maxProviderField {
			return fmt.Errorf("%w: a provider field is longer than its bound", domain.ErrInvalidMetadata)
		}
	}
	obj, err := json.Marshal(fields)
	if err != nil {
		return fmt.Errorf("%w: %w", domain.ErrInvalidMetadata, err)
	}
	res := l.db.WithContext(ctx).Exec(`UPDATE tokenguard_connections SET metadata = metadata || jsonb_build_object('provider_fields', ?::jsonb) WHERE name = ?`,
		string(obj), connection)
	if res.Error != nil {
		return storeError(ctx, "set provider fields", res.Error)
	}
	if res.RowsAffected == 0 {
		return fmt.Errorf("set provider fields of %s: %w", connection, domain.ErrNotFound)
	}
	return nil
}

// SetMetadata replaces the connection's metadata inside the locked
// transaction, before the Put of a new grant commits both: a grant that
// is refused (or fails) leaves the metadata as it was. No token column is
// touched and nothing is announced: no process caches metadata.
func (l *LockedTokens) SetMetadata(ctx context.Context, connection string, m domain.Metadata) error {
	object := string(m.Object)
	if object == "" {
		object = "{}"
	}
	res := l.db.WithContext(ctx).Exec("UPDATE tokenguard_connections SET metadata = ?::jsonb, tags = ?::text[] WHERE name = ?",
		object, tagArray(m.Tags), connection)
	if res.Error != nil {
		return storeError(ctx, "set metadata", res.Error)
	}
	if res.RowsAffected == 0 {
		return fmt.Errorf("set metadata of %s: %w", connection, domain.ErrNotFound)
	}
	return nil
}

// compactJSON is a stored jsonb as compact JSON: Postgres writes it with
// spaces after ':' and ','.
func compactJSON(stored string) json.RawMessage {
	var buf bytes.Buffer
	if json.Compact(&buf, []byte(stored)) != nil {
		return json.RawMessage(stored)
	}
	return buf.Bytes()
}

// tagArray is tags as a text[] literal.
func tagArray(tags []string) string {
	return "{" + strings.Join(quoteAll(tags), ",") + "}"
}

// disconnectHold bounds a disconnection once it holds the lock: one write
// and its commit (the revocation at the provider comes before, under a
// refresh lease, with no lock held).
const disconnectHold = 10 * time.Second

// Disconnect deletes connection's token under its advisory lock, the one
// refreshes take (wait bounds the wait, reported as domain.ErrLockTimeout):
// a refresh in progress finishes first, and one that waits for the lock
// finds no token after it. Before deleting, it calls before with the token
// read under the lock, which says whether it was revoked at the provider
// (before must not wait on anything: the lock and a pool connection are
// held); before's error keeps everything as it was and is returned.
//
// The delete announces "<version+1> <connection>" on ChangeChannel in the
// writing statement, so every process drops its cached token at commit,
// resets the connection's metadata and tags, records that version so that a
// later grant of the same name continues above it, and queues a
// connection.disconnected webhook event. The connection's name and lock
// key stay registered. It returns the token as it was deleted.
func (r *TokenRepository) Disconnect(ctx context.Context, connection string, wait time.Duration,
	before func(ctx context.Context, t domain.Token) (revoked bool, err error)) (domain.Token, error) {
	var found domain.Token
	err := r.inLock(ctx, connection, wait, disconnectHold, func(ctx context.Context, tx *gorm.DB) error {
		var err error
		if found, err = getToken(ctx, tx, r.sealer, r.ids, connection); err != nil {
			return err
		}
		revoked := false
		if before != nil {
			if revoked, err = before(ctx, found); err != nil {
				return err
			}
		}
		row, err := oneRow(tx, `
WITH u AS (
    DELETE FROM tokenguard_tokens AS t USING tokenguard_connections c
    WHERE c.id = t.connection_id AND c.name = $1 AND t.version = $2
    RETURNING c.id AS lock_key, c.name, t.*
),
m AS (
    UPDATE tokenguard_connections c SET metadata = '{}', tags = '{}', retired_version = greatest(c.retired_version, u.version + 1)
    FROM u WHERE c.id = u.lock_key
),
w AS (
    INSERT INTO tokenguard_webhook_outbox (type, connection, data)
    SELECT 'connection.disconnected', u.name, jsonb_strip_nulls(jsonb_build_object(
        'version', u.version + 1, 'revoked', $4::boolean,
        'provider', u.provider,
        'metadata', c.metadata, 'tags', to_jsonb(c.tags)))
    FROM u JOIN tokenguard_connections c ON c.id = u.lock_key
)
SELECT `+tokenColumns+` FROM u, LATERAL pg_notify(`+channelInSchema("$3")+`, (u.version + 1) || ' ' || u.name)`,
			connection, found.Version, ChangeChannel, revoked)
		if err != nil {
			return storeError(ctx, "disconnect", err)
		}
		if row == nil {
			// Cannot happen while the lock is held: every writer takes it.
			return fmt.Errorf("disconnect %s at version %d: %w", connection, found.Version, domain.ErrConflict)
		}
		return nil
	})
	if err != nil {
		return domain.Token{}, err
	}
	return found, nil
}
