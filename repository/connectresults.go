package repository

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
)

// ResultLifetime bounds how long a pending grant waits for its redemption.
const ResultLifetime = 10 * time.Minute

// ConnectResults keeps connect flows' grants, sealed, by their result code's hash until redeemed.
type ConnectResults struct {
	db     *gorm.DB
	sealer Sealer
}

// NewConnectResults binds the store to a pool and the tokens' sealer.
func NewConnectResults(db *gorm.DB, sealer Sealer) *ConnectResults {
	return &ConnectResults{db: db, sealer: sealer}
}

// resultAAD binds a sealed value to its row (the result's hash) and column.
func resultAAD(hashHex, column string) string { return "connect_result/" + hashHex + "/" + column }

// Keep stores p and returns its one-time result code and its expiry.
func (c *ConnectResults) Keep(ctx context.Context, p domain.PendingGrant) (domain.Secret, time.Time, error) {
	if err := domain.ValidateName(p.Connection); err != nil {
		return domain.Secret{}, time.Time{}, err
	}
	if p.Grant.AccessToken.IsZero() || p.Grant.RefreshToken.IsZero() {
		return domain.Secret{}, time.Time{}, fmt.Errorf("keep the grant of %s: %w: no access or refresh token", p.Connection, domain.ErrInvalidToken)
	}
	code := domain.NewCredential(domain.ResultPrefix)
	h := hashParam(code)
	at, err := c.sealer.Seal(p.Grant.AccessToken.Reveal(), resultAAD(h, colAccess))
	if err != nil {
		return domain.Secret{}, time.Time{}, fmt.Errorf("seal the pending access token of %s: %w", p.Connection, err)
	}
	rt, err := c.sealer.Seal(p.Grant.RefreshToken.Reveal(), resultAAD(h, colRefresh))
	if err != nil {
		return domain.Secret{}, time.Time{}, fmt.Errorf("seal the pending refresh token of %s: %w", p.Connection, err)
	}
	var dpopKey any // NULL: a bearer grant
	if !p.DPoPKey.IsZero() {
		if dpopKey, err = c.sealer.Seal(p.DPoPKey.Reveal(), resultAAD(h, "dpop_key/"+p.DPoPJKT)); err != nil {
			return domain.Secret{}, time.Time{}, fmt.Errorf("seal the pending dpop key of %s: %w", p.Connection, err)
		}
	}
	var metadata, tags any // NULL: keep the connection's
	if p.Metadata != nil {
		metadata, tags = string(p.Metadata.Object), tagArray(p.Metadata.Tags)
	}
	var fields any // NULL: none
	if len(p.ProviderFields) > 0 {
		b, _ := json.Marshal(p.ProviderFields) // a map[string]string always marshals
		fields = string(b)
	}
	expires, err := scan[time.Time](ctx, c.db, "keep connect result", `INSERT INTO tokenguard_connect_results (result_hash, connection, provider, created_by, allow_account_change,
    metadata, tags, provider_fields, granted_account, granted_scopes, missing_scopes,
    access_token, token_type, refresh_token, expiry, refresh_expiry, expires_at, dpop_key, dpop_jkt)
VALUES (decode(?, 'hex'), ?, NULLIF(?, ''), ?, ?, ?::jsonb, ?::text[], ?::jsonb, ?, coalesce(?::text[], '{}'), coalesce(?::text[], '{}'),
    ?, ?, ?, ?, ?, now() + ?::interval, ?, NULLIF(?, '')) RETURNING expires_at`,
		h, p.Connection, p.Provider, p.CreatedBy, p.AllowAccountChange, metadata, tags, fields,
		p.Binding.Account, textArray(p.Binding.Scopes), textArray(p.Binding.MissingScopes),
		at, p.Grant.TokenType, rt, nullTime(p.Grant.Expiry), nullTime(p.Grant.RefreshExpiry),
		fmt.Sprintf("%d milliseconds", ResultLifetime.Milliseconds()), dpopKey, p.DPoPJKT)
	if err != nil {
		return domain.Secret{}, time.Time{}, err
	}
	return code, expires, nil
}

type resultRow struct {
	ID                 int64
	HashHex            string
	Connection         string
	Provider           string
	CreatedBy          string
	AllowAccountChange bool
	Metadata           sql.NullString
	Tags               sql.NullString // a JSON array
	ProviderFields     sql.NullString
	GrantedAccount     string
	GrantedScopes      string // space-separated
	MissingScopes      string
	AccessToken        string
	TokenType          string
	RefreshToken       string
	Expiry             sql.NullTime
	RefreshExpiry      sql.NullTime
	ExpiresAt          time.Time
	CreatedAt          time.Time
	DPoPKey            string `gorm:"column:dpop_key"`
	DPoPJKT            string `gorm:"column:dpop_jkt"`
}

const resultColumns = `id, encode(result_hash, 'hex') AS hash_hex, connection, coalesce(provider, '') AS provider, created_by, allow_account_change,
    metadata::text AS metadata, array_to_json(tags)::text AS tags, provider_fields::text AS provider_fields,
    granted_account, array_to_string(granted_scopes, ' ') AS granted_scopes, array_to_string(missing_scopes, ' ') AS missing_scopes,
    access_token, token_type, refresh_token, expiry, refresh_expiry, expires_at, created_at,
    coalesce(dpop_key, '') AS dpop_key, coalesce(dpop_jkt, '') AS dpop_jkt`

// Pending reads code's unexpired result, its id (for SpendResult) and grant; else domain.ErrResultInvalid.
func (c *ConnectResults) Pending(ctx context.Context, code domain.Secret) (int64, domain.PendingGrant, error) {
	if !domain.WellFormed(code.Reveal(), domain.ResultPrefix) {
		return 0, domain.PendingGrant{}, fmt.Errorf("redeem: %w", domain.ErrResultInvalid)
	}
	r, err := oneRow[resultRow](ctx, c.db, "read connect result", fmt.Errorf("redeem: %w", domain.ErrResultInvalid),
		`SELECT `+resultColumns+` FROM tokenguard_connect_results WHERE result_hash = decode(?, 'hex') AND expires_at > now()`, hashParam(code))
	if err != nil {
		return 0, domain.PendingGrant{}, err
	}
	at, err := c.sealer.Open(r.AccessToken, resultAAD(r.HashHex, colAccess))
	if err != nil {
		return 0, domain.PendingGrant{}, fmt.Errorf("pending access token of %s: %w", r.Connection, err)
	}
	rt, err := c.sealer.Open(r.RefreshToken, resultAAD(r.HashHex, colRefresh))
	if err != nil {
		return 0, domain.PendingGrant{}, fmt.Errorf("pending refresh token of %s: %w", r.Connection, err)
	}
	p := domain.PendingGrant{Connection: r.Connection, Provider: r.Provider, CreatedBy: r.CreatedBy, AllowAccountChange: r.AllowAccountChange,
		Binding:   domain.Binding{Account: r.GrantedAccount, Scopes: r.GrantedScopes, MissingScopes: r.MissingScopes},
		Grant:     domain.Grant{AccessToken: domain.NewSecret(at), TokenType: r.TokenType, RefreshToken: domain.NewSecret(rt), Expiry: r.Expiry.Time, RefreshExpiry: r.RefreshExpiry.Time},
		ExpiresAt: r.ExpiresAt, Metadata: storedMetadata(r.Metadata, r.Tags)}
	if r.ProviderFields.Valid {
		_ = json.Unmarshal([]byte(r.ProviderFields.String), &p.ProviderFields) // written by Keep
	}
	if r.DPoPKey != "" {
		key, err := c.sealer.Open(r.DPoPKey, resultAAD(r.HashHex, "dpop_key/"+r.DPoPJKT))
		if err != nil {
			return 0, domain.PendingGrant{}, fmt.Errorf("pending dpop key of %s: %w", r.Connection, err)
		}
		p.DPoPKey, p.DPoPJKT = domain.NewSecret(key), r.DPoPJKT
	}
	return r.ID, p, nil
}

// Refuse expires the result id at once: a grant that cannot be stored is never redeemable again,
// and the sweep revokes it.
func (c *ConnectResults) Refuse(ctx context.Context, id int64) error {
	return exec(ctx, c.db, "refuse connect result", "UPDATE tokenguard_connect_results SET expires_at = least(expires_at, now()) WHERE id = ?", id)
}

// Expired leases up to limit expired results for lease, away from other sweeps, tokens opened.
func (c *ConnectResults) Expired(ctx context.Context, limit int, lease time.Duration) ([]domain.ExpiredGrant, error) {
	rows, err := allRows(ctx, c.db, "lease expired connect results", asIs[resultRow], `UPDATE tokenguard_connect_results r SET sweep_after = now() + ?::interval
FROM (SELECT id FROM tokenguard_connect_results
      WHERE expires_at <= now() AND (sweep_after IS NULL OR sweep_after <= now())
      ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED) s
WHERE r.id = s.id
RETURNING r.id, encode(r.result_hash, 'hex') AS hash_hex, r.connection, coalesce(r.provider, '') AS provider, r.refresh_token, r.created_at,
          coalesce(r.dpop_key, '') AS dpop_key, coalesce(r.dpop_jkt, '') AS dpop_jkt`,
		fmt.Sprintf("%d milliseconds", lease.Milliseconds()), limit)
	if err != nil {
		return nil, err
	}
	out := make([]domain.ExpiredGrant, 0, len(rows))
	for _, r := range rows {
		e := domain.ExpiredGrant{ID: r.ID, Connection: r.Connection, Provider: r.Provider, CreatedAt: r.CreatedAt}
		rt, err := c.sealer.Open(r.RefreshToken, resultAAD(r.HashHex, colRefresh))
		if err != nil {
			// Not revocable with these keys; kept for keys that can.
			continue
		}
		e.RefreshToken = domain.NewSecret(rt)
		if r.DPoPKey != "" {
			if key, err := c.sealer.Open(r.DPoPKey, resultAAD(r.HashHex, "dpop_key/"+r.DPoPJKT)); err == nil {
				e.DPoPKey = domain.NewSecret(key)
			}
		}
		out = append(out, e)
	}
	return out, nil
}

// Delete removes the result id (its grant revoked, or beyond revoking).
func (c *ConnectResults) Delete(ctx context.Context, id int64) error {
	return exec(ctx, c.db, "delete connect result", "DELETE FROM tokenguard_connect_results WHERE id = ?", id)
}

// SpendResult deletes the unexpired result id inside the locked transaction storing its grant:
// of two redemptions of one code, the other gets domain.ErrResultInvalid.
func (l *LockedTokens) SpendResult(ctx context.Context, id int64) error {
	return changedRow(ctx, l.db, "spend connect result", fmt.Errorf("connect result: %w", domain.ErrResultInvalid),
		"DELETE FROM tokenguard_connect_results WHERE id = ? AND expires_at > now()", id)
}
