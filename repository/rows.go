package repository

import (
	"database/sql"
	"strings"
	"time"

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
	Provider       string // '' for the environment's provider
	// The refresh failure episode of this version (failureColumns).
	Failures      int
	FailureSince  sql.NullTime
	FailureLast   sql.NullTime
	RetryAt       sql.NullTime
	ReplayUntil   sql.NullTime
	FailureStatus int
	FailureCode   string
	Failing       bool
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
	at, rt, err := opened(s, r.Name, r.AccessToken, r.RefreshToken)
	if err != nil {
		return domain.Token{}, err
	}
	return domain.Token{
		Connection:    r.Name,
		AccessToken:   domain.NewSecret(at),
		TokenType:     r.TokenType,
		RefreshToken:  domain.NewSecret(rt),
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
		},
		Provider: r.Provider,
		Failure:  r.failure(),
	}, nil
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
