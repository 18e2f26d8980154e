package repository

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
)

// SessionLifetime bounds a connect session and, from its opening, its flow.
const SessionLifetime = 10 * time.Minute

// ConnectSessions stores connect sessions by their token's hash, browser flows by their cookie's.
type ConnectSessions struct{ db *gorm.DB }

// NewConnectSessions binds the store to a pool.
func NewConnectSessions(db *gorm.DB) *ConnectSessions { return &ConnectSessions{db: db} }

// Create stores a session and returns its token and expiry, deleting old rows.
func (c *ConnectSessions) Create(ctx context.Context, s domain.ConnectSession) (domain.Secret, time.Time, error) {
	if err := domain.ValidateName(s.Connection); err != nil {
		return domain.Secret{}, time.Time{}, err
	}
	token := domain.NewCredential(domain.SessionPrefix)
	var metadata, tags any // NULL: the session says nothing about metadata
	if s.Metadata != nil {
		metadata, tags = string(s.Metadata.Object), tagArray(s.Metadata.Tags)
	}
	expires, err := scan[time.Time](ctx, c.db, "create connect session", `INSERT INTO tokenguard_connect_sessions (token_hash, connection, return_to, allow_account_change, created_by, expires_at, provider, metadata, tags)
VALUES (decode(?, 'hex'), ?, ?, ?, ?, now() + ?::interval, NULLIF(?, ''), ?::jsonb, ?::text[]) RETURNING expires_at`,
		hashParam(token), s.Connection, s.ReturnTo, s.AllowAccountChange, s.CreatedBy, fmt.Sprintf("%d milliseconds", SessionLifetime.Milliseconds()),
		s.Provider, metadata, tags)
	if err != nil {
		return domain.Secret{}, time.Time{}, err
	}
	_ = exec(ctx, c.db, "delete old connect sessions", "DELETE FROM tokenguard_connect_sessions WHERE expires_at < now() - interval '1 day'")
	return token, expires, nil
}

// Open spends the session token (single use: domain.ErrUnauthorized if unknown, expired or used)
// and binds the browser flow to it: the cookie's hash, the OAuth2 state and PKCE verifier. The
// flow expires SessionLifetime after opening.
func (c *ConnectSessions) Open(ctx context.Context, token, flow domain.Secret, state, verifier string) (domain.ConnectSession, error) {
	return c.one(ctx, "open connect session", "connect session", `UPDATE tokenguard_connect_sessions
SET opened_at = now(), expires_at = now() + ?::interval, flow_hash = decode(?, 'hex'), oauth_state = ?, pkce_verifier = ?
WHERE token_hash = decode(?, 'hex') AND opened_at IS NULL AND expires_at > now()
RETURNING `+sessionColumns+`, oauth_state, pkce_verifier`,
		fmt.Sprintf("%d milliseconds", SessionLifetime.Milliseconds()), hashParam(flow), state, verifier, hashParam(token))
}

// Peek reads an unopened, unexpired session without spending it; domain.ErrUnauthorized otherwise.
func (c *ConnectSessions) Peek(ctx context.Context, token domain.Secret) (domain.ConnectSession, error) {
	return c.one(ctx, "read connect session", "connect session", `SELECT `+sessionColumns+`
FROM tokenguard_connect_sessions WHERE token_hash = decode(?, 'hex') AND opened_at IS NULL AND expires_at > now()`, hashParam(token))
}

// Finish spends the browser flow whose cookie is flow and OAuth2 state is state (single use:
// domain.ErrUnauthorized if unknown, expired or finished, or the state is another's, which leaves
// the flow as it was) and returns it with its verifier, erased from the table.
func (c *ConnectSessions) Finish(ctx context.Context, flow domain.Secret, state string) (domain.ConnectSession, error) {
	return c.one(ctx, "finish connect flow", "connect flow", `WITH s AS (
    SELECT id, oauth_state, pkce_verifier FROM tokenguard_connect_sessions
    WHERE flow_hash = decode(?, 'hex') AND finished_at IS NULL AND opened_at IS NOT NULL AND expires_at > now()
      AND oauth_state <> '' AND oauth_state = ?
    FOR UPDATE
)
UPDATE tokenguard_connect_sessions c SET finished_at = now(), oauth_state = '', pkce_verifier = ''
FROM s WHERE c.id = s.id
RETURNING `+sessionColumns+`, s.oauth_state, s.pkce_verifier`,
		hashParam(flow), state)
}

// one runs a statement returning at most one session; none is domain.ErrUnauthorized (what names it).
func (c *ConnectSessions) one(ctx context.Context, op, what, sql string, args ...any) (domain.ConnectSession, error) {
	r, err := oneRow[sessionRow](ctx, c.db, op, fmt.Errorf("%s: %w", what, domain.ErrUnauthorized), sql, args...)
	if err != nil {
		return domain.ConnectSession{}, err
	}
	return domain.ConnectSession{Connection: r.Connection, ReturnTo: r.ReturnTo, AllowAccountChange: r.AllowAccountChange,
		CreatedBy: r.CreatedBy, ExpiresAt: r.ExpiresAt, State: r.OauthState, Verifier: r.PkceVerifier, Provider: r.Provider,
		Metadata: storedMetadata(r.Metadata, r.Tags)}, nil
}

// sessionColumns read sessionRow but its OAuth2 state and verifier.
const sessionColumns = `connection, return_to, allow_account_change, created_by, expires_at,
    coalesce(provider, '') AS provider, metadata::text AS metadata, array_to_json(tags)::text AS tags`

type sessionRow struct {
	Connection         string
	ReturnTo           string
	AllowAccountChange bool
	CreatedBy          string
	ExpiresAt          time.Time
	OauthState         string
	PkceVerifier       string
	Provider           string
	Metadata           sql.NullString // NULL: the session says nothing about metadata
	Tags               sql.NullString // a JSON array
}

// storedMetadata is the metadata a session or result was given (NULL: none).
func storedMetadata(object, tags sql.NullString) *domain.Metadata {
	if !object.Valid {
		return nil
	}
	m := readMetadata(object.String, tags.String)
	return &m
}
