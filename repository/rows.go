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

// tokenRow is the tokenguard_tokens table joined with the connection's name. It stays
// inside this package: the rest of the code only sees domain.Token.
type tokenRow struct {
	LockKey       int32
	Name          string
	AccessToken   string
	TokenType     string
	RefreshToken  string
	Expiry        sql.NullTime
	RefreshExpiry sql.NullTime
	ObtainedAt    time.Time
	Version       int64
	Status        string
	StatusReason  string
	UpdatedAt     time.Time
	// Who granted it: '' when unknown; scopes space-separated.
	GrantedAccount string
	GrantedScopes  string
	MissingScopes  string
	AnsweredScopes string // the latest refresh answer's scope (migration 29)
	ScopesReduced  string
	Provider       string // '' for the environment's provider
	// SealedVersion is the version the credentials of the earlier bound
	// form are sealed at (0: NULL, bound to Version, or of an older form,
	// or plaintext).
	SealedVersion int64
	// The refresh failure episode of this version (failureColumns).
	Failures      int
	FailureSince  sql.NullTime
	FailureLast   sql.NullTime
	RetryAt       sql.NullTime
	ReplayUntil   sql.NullTime
	FailureStatus int
	FailureCode   string
	Failing       bool
	DPoPJKT       string `gorm:"column:dpop_jkt"` // '' for a bearer grant
}

func (r tokenRow) failure() domain.RefreshFailure {
	return failureOf(r.Failures, r.FailureSince, r.FailureLast, r.RetryAt, r.ReplayUntil, r.FailureStatus, r.FailureCode, r.Failing)
}

func failureOf(n int, since, last, retry, replay sql.NullTime, status int, code string, failing bool) domain.RefreshFailure {
	if n == 0 {
		return domain.RefreshFailure{}
	}
	return domain.RefreshFailure{Failures: n, Since: since.Time, LastAt: last.Time, RetryAt: retry.Time,
		ReplayUntil: replay.Time, HTTPStatus: status, Code: code, Failing: failing}
}

// domain opens the row's credentials with s: a value that fails to open is
// an error wrapping domain.ErrUndecryptable, never a token.
func (r tokenRow) domain(s Sealer) (domain.Token, error) {
	at, rt, err := opened(s, r.Name, seal{r.LockKey, r.Version}, r.SealedVersion, r.AccessToken, r.RefreshToken)
	if err != nil {
		return domain.Token{}, err
	}
	t := r.record()
	t.AccessToken, t.RefreshToken = domain.NewSecret(at), domain.NewSecret(rt)
	return t, nil
}

// record is the row's token without its credentials.
func (r tokenRow) record() domain.Token {
	return domain.Token{
		Connection:    r.Name,
		TokenType:     r.TokenType,
		Expiry:        r.Expiry.Time,
		RefreshExpiry: r.RefreshExpiry.Time,
		ObtainedAt:    r.ObtainedAt,
		Version:       r.Version,
		Status:        domain.Status(r.Status),
		StatusReason:  r.StatusReason,
		UpdatedAt:     r.UpdatedAt,
		Binding: domain.Binding{
			Account:       r.GrantedAccount,
			Scopes:        r.GrantedScopes,
			MissingScopes: r.MissingScopes,
			Answered:      r.AnsweredScopes,
			ScopesReduced: r.ScopesReduced,
		},
		Provider: r.Provider,
		Failure:  r.failure(),
		DPoPJKT:  r.DPoPJKT,
	}
}

// textArray is space-separated scopes as a text[] parameter; "" is NULL
// (unknown, or none missing).
func textArray(scopes string) any {
	if scopes == "" {
		return nil
	}
	return "{" + strings.Join(quoteAll(strings.Fields(scopes)), ",") + "}"
}

// quoteAll quotes array elements for Postgres's array literal.
func quoteAll(v []string) []string {
	out := make([]string, len(v))
	for i, s := range v {
		out[i] = `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
	}
	return out
}

func nullTime(t time.Time) sql.NullTime { return sql.NullTime{Time: t, Valid: !t.IsZero()} }

// connIDs caches connections' ids by name, for sealing before a write:
// tokenguard never deletes a connections row, and every write checks the
// id it sealed with (c.id = ...), so an entry gone stale (a row deleted
// and re-created by hand) writes nothing and is read again.
type connIDs struct{ m sync.Map }

func (c *connIDs) put(row *tokenRow) {
	if c != nil && row != nil {
		c.m.Store(row.Name, row.LockKey)
	}
}

// lookup is name's id: the cached one, else read on db (the caller's own
// connection or transaction).
func (c *connIDs) lookup(ctx context.Context, db *gorm.DB, name string) (int32, error) {
	if v, ok := c.m.Load(name); ok {
		return v.(int32), nil
	}
	var ids []int32
	if err := db.WithContext(ctx).Raw("SELECT id FROM tokenguard_connections WHERE name = ?", name).Find(&ids).Error; err != nil {
		return 0, storeError(ctx, "read connection id", err)
	}
	if len(ids) == 0 {
		return 0, fmt.Errorf("connection %q: %w", name, domain.ErrNotFound)
	}
	c.m.Store(name, ids[0])
	return ids[0], nil
}

func (c *connIDs) forget(name string) { c.m.Delete(name) }
