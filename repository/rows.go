package repository

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
)

// tokenRow is a token joined with its connection, as tokenColumns read it.
type tokenRow struct {
	LockKey       int32
	Name          string
	AccessToken   string
	TokenType     string
	RefreshToken  string
	Expiry        time.Time // NULL reads as zero
	RefreshExpiry time.Time
	ObtainedAt    time.Time
	Version       int64
	Status        domain.Status
	StatusReason  string
	UpdatedAt     time.Time
	Binding       domain.Binding        `gorm:"embedded"` // NULL reads as ""; scopes space-separated
	Provider      string                // '' for the environment's provider
	SealedVersion int64                 // the version the earlier bound form is sealed at (0: NULL)
	Failure       domain.RefreshFailure `gorm:"embedded"`        // of the version (failureColumns; NULL times read as zero)
	DPoPJKT       string                `gorm:"column:dpop_jkt"` // '' for a bearer grant
}

// record is the row's token without its credentials.
func (r tokenRow) record() domain.Token {
	return domain.Token{
		Connection:    r.Name,
		TokenType:     r.TokenType,
		Expiry:        r.Expiry,
		RefreshExpiry: r.RefreshExpiry,
		ObtainedAt:    r.ObtainedAt,
		Version:       r.Version,
		Status:        r.Status,
		StatusReason:  r.StatusReason,
		UpdatedAt:     r.UpdatedAt,
		Binding:       r.Binding,
		Provider:      r.Provider,
		Failure:       r.Failure,
		DPoPJKT:       r.DPoPJKT,
	}
}

// textArray is space-separated scopes as a text[] parameter; "" is NULL (unknown, or none missing).
func textArray(scopes string) any {
	if scopes == "" {
		return nil
	}
	return tagArray(strings.Fields(scopes))
}

// stringArray is a text[] parameter; nil is NULL.
func stringArray[S ~string](v []S) any {
	if v == nil {
		return nil
	}
	return tagArray(v)
}

// tagArray is v as a text[] literal, every element quoted.
func tagArray[S ~string](v []S) string {
	out := make([]string, len(v))
	for i, s := range v {
		out[i] = `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(string(s)) + `"`
	}
	return "{" + strings.Join(out, ",") + "}"
}

func nullTime(t time.Time) sql.NullTime { return sql.NullTime{Time: t, Valid: !t.IsZero()} }

// connIDs caches connections' ids by name, for sealing before a write. Every write checks the id
// it sealed with, so a stale entry (a row re-created by hand) writes nothing and is read again.
type connIDs struct{ m sync.Map }

func (c *connIDs) put(row *tokenRow) { c.m.Store(row.Name, row.LockKey) }

// lookup is name's id: the cached one, else read on db.
func (c *connIDs) lookup(ctx context.Context, db *gorm.DB, name string) (int32, error) {
	if v, ok := c.m.Load(name); ok {
		return v.(int32), nil
	}
	id, err := oneRow[int32](ctx, db, "read connection id", fmt.Errorf("connection %q: %w", name, domain.ErrNotFound),
		"SELECT id FROM tokenguard_connections WHERE name = ?", name)
	if err != nil {
		return 0, err
	}
	c.m.Store(name, *id)
	return *id, nil
}

func (c *connIDs) forget(name string) { c.m.Delete(name) }

// oneRow runs a statement on db and returns its first row; no row is the error none (nil: a nil row).
func oneRow[T any](ctx context.Context, db *gorm.DB, op string, none error, sql string, args ...any) (*T, error) {
	var rows []T
	if err := db.WithContext(ctx).Raw(sql, args...).Find(&rows).Error; err != nil {
		return nil, storeError(ctx, op, err)
	}
	if len(rows) == 0 {
		return nil, none
	}
	return &rows[0], nil
}

// allRows runs a statement on db and returns its rows, each through conv (whose error stops it).
func allRows[T, D any](ctx context.Context, db *gorm.DB, op string, conv func(T) (D, error), sql string, args ...any) ([]D, error) {
	var rows []T
	if err := db.WithContext(ctx).Raw(sql, args...).Find(&rows).Error; err != nil {
		return nil, storeError(ctx, op, err)
	}
	out := make([]D, len(rows))
	for i, row := range rows {
		var err error
		if out[i], err = conv(row); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// asIs is allRows' conv for rows read as they are.
func asIs[T any](row T) (T, error) { return row, nil }

// keyedRows runs a statement on db and returns its rows as a map, each through kv.
func keyedRows[T any, K comparable, V any](ctx context.Context, db *gorm.DB, op string, kv func(T) (K, V), sql string, args ...any) (map[K]V, error) {
	rows, err := allRows(ctx, db, op, asIs[T], sql, args...)
	if err != nil {
		return nil, err
	}
	out := make(map[K]V, len(rows))
	for _, row := range rows {
		k, v := kv(row)
		out[k] = v
	}
	return out, nil
}

// scan runs a statement on db and scans its first row into a T (no row: the zero T).
func scan[T any](ctx context.Context, db *gorm.DB, op, sql string, args ...any) (T, error) {
	var v T
	err := db.WithContext(ctx).Raw(sql, args...).Scan(&v).Error
	return v, storeError(ctx, op, err)
}

// exec runs a statement on db.
func exec(ctx context.Context, db *gorm.DB, op, sql string, args ...any) error {
	return storeError(ctx, op, db.WithContext(ctx).Exec(sql, args...).Error)
}

// changedRow runs a write on db that must change a row; none is the error when it changes none.
func changedRow(ctx context.Context, db *gorm.DB, op string, none error, sql string, args ...any) error {
	res := db.WithContext(ctx).Exec(sql, args...)
	if res.Error == nil && res.RowsAffected == 0 {
		return none
	}
	return storeError(ctx, op, res.Error)
}
