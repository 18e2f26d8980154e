package repository

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
)

// selectConnection reads connectionRows: what a listing shows, never a credential.
var selectConnection = "SELECT c.name, " + recordFields + `c.metadata::text AS metadata, array_to_json(c.tags)::text AS tags,
       ` + failureColumns + tokenFrom

// connectionRow is a row of selectConnection: a tokenRow without credentials.
type connectionRow struct {
	Token    tokenRow `gorm:"embedded"`
	Metadata string
	Tags     string // a JSON array
}

func (r connectionRow) domain() domain.Connection {
	t := r.Token.record()
	if t.Failure.Failing && t.Status == domain.StatusActive {
		t.Status, t.StatusReason = domain.StatusFailing, t.Failure.Describe()
	}
	return domain.Connection{
		Name:          t.Connection,
		Provider:      t.Provider,
		Status:        t.Status,
		StatusReason:  t.StatusReason,
		Failure:       t.Failure,
		Expiry:        t.Expiry,
		RefreshExpiry: t.RefreshExpiry,
		ObtainedAt:    t.ObtainedAt,
		Version:       t.Version,
		UpdatedAt:     t.UpdatedAt,
		Binding:       t.Binding,
		Metadata:      readMetadata(r.Metadata, r.Tags),
		DPoPJKT:       t.DPoPJKT,
	}
}

// ConnectionsPage lists up to limit connections that have a token, whose names sort after after
// ("" first), in byte order of the name (the same under every collation).
func (r *TokenRepository) ConnectionsPage(ctx context.Context, after string, limit int) ([]domain.Connection, error) {
	return r.FilteredConnectionsPage(ctx, domain.ConnectionFilter{}, after, limit)
}

// FilteredConnectionsPage is ConnectionsPage with only the connections f matches; each of the
// key's patterns (f.Patterns) becomes a range of the name index stopping at limit rows.
func (r *TokenRepository) FilteredConnectionsPage(ctx context.Context, f domain.ConnectionFilter, after string, limit int) ([]domain.Connection, error) {
	scans, all := domain.KeyAccess{Connections: f.Patterns}.ConnectionScans()
	if !all && len(scans) == 0 {
		return nil, nil // the key's patterns match no name
	}
	where, args := []string{`c.name COLLATE "C" > ?`}, []any{after}
	and := func(cond string, a ...any) { where, args = append(where, cond), append(args, a...) }
	switch f.Status {
	case "":
	case domain.StatusExpiringSoon:
		and("t.status = 'active' AND t.refresh_expiry < now() + ? * interval '1 second'", int64(domain.ExpiringSoonWithin/time.Second))
	default:
		and("t.status = ?", string(f.Status))
	}
	switch f.Provider {
	case "":
	case domain.EnvProvider:
		and("t.provider IS NULL")
	default:
		and("t.provider = ?", f.Provider)
	}
	if f.Tag != "" {
		and("c.tags @> ARRAY[?]::text[]", f.Tag)
	}
	if f.NamePrefix != "" {
		and(`c.name COLLATE "C" >= ? AND starts_with(c.name, ?)`, f.NamePrefix, f.NamePrefix)
	}
	const page = ` ORDER BY c.name COLLATE "C" LIMIT ?`
	q, qargs := selectConnection+" WHERE "+strings.Join(where, " AND ")+page, append(args, limit)
	if !all {
		// One page per pattern, merged: a name two patterns match is listed once (UNION).
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
	return allRows(ctx, r.db, "list connections", func(row connectionRow) (domain.Connection, error) { return row.domain(), nil }, q, qargs...)
}

// scanCondition is the SQL condition of a pattern's scan: the name itself, or the byte-order range
// of names its literal prefix starts, then the pattern's regular expression.
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

// EachConnection calls fn with every connection that has a token, by name, until fn fails.
func (r *TokenRepository) EachConnection(ctx context.Context, fn func(domain.Connection) error) error {
	return eachPage(func(after string) ([]domain.Connection, error) { return r.ConnectionsPage(ctx, after, DefaultPage) },
		func(c domain.Connection) string { return c.Name }, fn)
}

// Connection reads one connection as listings show it (no token: domain.ErrNotFound).
func (r *TokenRepository) Connection(ctx context.Context, connection string) (domain.Connection, error) {
	row, err := oneRow[connectionRow](ctx, r.db, "read connection", fmt.Errorf("connection %q: %w", connection, domain.ErrNotFound),
		selectConnection+" WHERE c.name = ?", connection)
	if err != nil {
		return domain.Connection{}, err
	}
	return row.domain(), nil
}

// maxProviderField bounds a value kept from a provider's answer.
const maxProviderField = 2048

// SetProviderFields replaces the metadata's "provider_fields" object (values up to 2 KiB).
func (l *LockedTokens) SetProviderFields(ctx context.Context, connection string, fields map[string]string) error {
	for k, v := range fields {
		if len(k) > 64 || len(v) > maxProviderField {
			return fmt.Errorf("%w: a provider field is longer than its bound", domain.ErrInvalidMetadata)
		}
	}
	obj, _ := json.Marshal(fields) // a map[string]string always marshals
	return changedRow(ctx, l.db, "set provider fields", fmt.Errorf("set provider fields of %s: %w", connection, domain.ErrNotFound),
		`UPDATE tokenguard_connections SET metadata = metadata || jsonb_build_object('provider_fields', ?::jsonb) WHERE name = ?`,
		string(obj), connection)
}

// SetMetadata replaces the connection's metadata inside the locked transaction, so that a grant
// refused leaves it as it was. Nothing is announced: no process caches metadata.
func (l *LockedTokens) SetMetadata(ctx context.Context, connection string, m domain.Metadata) error {
	return changedRow(ctx, l.db, "set metadata", fmt.Errorf("set metadata of %s: %w", connection, domain.ErrNotFound),
		"UPDATE tokenguard_connections SET metadata = ?::jsonb, tags = ?::text[] WHERE name = ?", cmp.Or(string(m.Object), "{}"), tagArray(m.Tags), connection)
}

// readMetadata reads a stored jsonb object, without the spaces Postgres writes, and the
// array_to_json of its tags (NULL or empty: nil).
func readMetadata(object, tags string) domain.Metadata {
	m := domain.Metadata{Object: json.RawMessage(object)}
	var buf bytes.Buffer
	if json.Compact(&buf, m.Object) == nil {
		m.Object = buf.Bytes()
	}
	if json.Unmarshal([]byte(tags), &m.Tags) != nil || len(m.Tags) == 0 {
		m.Tags = nil
	}
	return m
}

// Disconnect deletes connection's token under its lock (wait bounds the wait). before gets the
// token read under the lock and says whether it was revoked; it must not wait on anything (a
// lock and a pool connection are held), and its error changes nothing. The delete announces
// "<version+1> <connection>", resets the metadata, retires the version and queues a
// connection.disconnected event. It returns the token as deleted.
func (r *TokenRepository) Disconnect(ctx context.Context, connection string, wait time.Duration,
	before func(ctx context.Context, t domain.Token) (revoked bool, err error)) (found domain.Token, err error) {
	err = r.inLock(ctx, connection, wait, operatorHold, func(ctx context.Context, tx *gorm.DB) error {
		if found, err = r.get(ctx, tx, connection); err != nil {
			return err
		}
		revoked := false
		if before != nil {
			if revoked, err = before(ctx, found); err != nil {
				return err
			}
		}
		// A conflict cannot happen while the lock is held: every writer takes it.
		conflict := fmt.Errorf("disconnect %s at version %d: %w", connection, found.Version, domain.ErrConflict)
		_, err = oneRow[tokenRow](ctx, tx, "disconnect", conflict, `
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
        'version', u.version + 1, 'revoked', $4::boolean, 'provider', u.provider,
        'metadata', c.metadata, 'tags', to_jsonb(c.tags)))
    FROM u JOIN tokenguard_connections c ON c.id = u.lock_key
)
SELECT `+tokenColumns+` FROM u, LATERAL pg_notify(`+channelInSchema("$3")+`, (u.version + 1) || ' ' || u.name)`,
			connection, found.Version, ChangeChannel, revoked)
		return err
	})
	if err != nil {
		return domain.Token{}, err
	}
	return found, nil
}

// CountByStatus counts the connections that have a stored token by status, an active one shown
// failing counted as failing only, in one aggregate (for the metrics at scrape time).
func (r *TokenRepository) CountByStatus(ctx context.Context) (map[domain.Status]int, error) {
	return counted[domain.Status](ctx, r.db, "count connections by status", `SELECT CASE WHEN t.status = 'active' AND f.failing THEN 'failing' ELSE t.status END AS key, count(*) AS n
FROM tokenguard_tokens t LEFT JOIN tokenguard_refresh_failures f ON f.connection_id = t.connection_id AND f.version = t.version
GROUP BY 1`)
}

// counted reads the (key, n) rows of a statement as a map.
func counted[K ~string](ctx context.Context, db *gorm.DB, op, sql string) (map[K]int, error) {
	return keyedRows(ctx, db, op, func(row count[K]) (K, int) { return row.Key, row.N }, sql)
}

type count[K ~string] struct {
	Key K
	N   int
}
