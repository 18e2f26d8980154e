package repository

import (
	"context"
	"database/sql"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/infra/provider"
)

// AuthStyles remembers, per token URL and client id, the client authentication style a token
// endpoint accepted, so that no process probes.
type AuthStyles struct{ db *gorm.DB }

// NewAuthStyles binds the store to a pool.
func NewAuthStyles(db *gorm.DB) *AuthStyles { return &AuthStyles{db: db} }

// Load returns the remembered style, or "" when there is none.
func (s *AuthStyles) Load(ctx context.Context, tokenURL, clientID string) (string, error) {
	return scan[string](ctx, s.db, "load client auth style",
		"SELECT style FROM tokenguard_client_auth_styles WHERE token_url = ? AND client_id = ?", tokenURL, clientID)
}

// Save remembers style, replacing what was remembered.
func (s *AuthStyles) Save(ctx context.Context, tokenURL, clientID, style string) error {
	return exec(ctx, s.db, "save client auth style", `
INSERT INTO tokenguard_client_auth_styles (token_url, client_id, style) VALUES (?, ?, ?)
ON CONFLICT (token_url, client_id) DO UPDATE SET style = EXCLUDED.style, updated_at = now()`,
		tokenURL, clientID, style)
}

// RefusalEvidence keeps what every process learned of a token endpoint's refusals, per token URL,
// client id and credentials digest.
type RefusalEvidence struct{ db *gorm.DB }

// NewRefusalEvidence binds the store to a pool.
func NewRefusalEvidence(db *gorm.DB) *RefusalEvidence { return &RefusalEvidence{db: db} }

type evidenceRow struct {
	CheckStatus              sql.NullInt64
	CheckCode                sql.NullString
	CheckClientAuthenticated sql.NullBool
	CheckedAt                sql.NullTime
	WorkedStyle              sql.NullString
	WorkedAt                 sql.NullTime
}

// LoadEvidence reads the evidence; none is the zero Evidence.
func (s *RefusalEvidence) LoadEvidence(ctx context.Context, tokenURL, clientID, credentials string) (provider.Evidence, error) {
	r, err := oneRow[evidenceRow](ctx, s.db, "load refusal evidence", nil, `
SELECT check_status, check_code, check_client_authenticated, checked_at, worked_style, worked_at
FROM tokenguard_refusal_evidence WHERE token_url = ? AND client_id = ? AND credentials = ?`,
		tokenURL, clientID, credentials)
	if err != nil || r == nil {
		return provider.Evidence{}, err
	}
	var ev provider.Evidence
	if r.CheckStatus.Valid && r.CheckedAt.Valid {
		ev.Fingerprint = &provider.Fingerprint{HTTPStatus: int(r.CheckStatus.Int64), Code: r.CheckCode.String,
			ClientAuthenticated: r.CheckClientAuthenticated.Bool, At: r.CheckedAt.Time}
	}
	if r.WorkedAt.Valid {
		ev.WorkedAt, ev.WorkedStyle = r.WorkedAt.Time, r.WorkedStyle.String
	}
	return ev, nil
}

// SaveFingerprint records the check's answer, replacing the last one.
func (s *RefusalEvidence) SaveFingerprint(ctx context.Context, tokenURL, clientID, credentials string, f provider.Fingerprint) error {
	return exec(ctx, s.db, "save the token endpoint check's answer", `
INSERT INTO tokenguard_refusal_evidence (token_url, client_id, credentials, check_status, check_code, check_client_authenticated, checked_at)
VALUES (?, ?, ?, ?, ?, ?, now())
ON CONFLICT (token_url, client_id, credentials) DO UPDATE SET check_status = EXCLUDED.check_status,
    check_code = EXCLUDED.check_code, check_client_authenticated = EXCLUDED.check_client_authenticated, checked_at = now()`,
		tokenURL, clientID, credentials, f.HTTPStatus, f.Code, f.ClientAuthenticated)
}

// SaveWorked records a success in style now (the database's clock).
func (s *RefusalEvidence) SaveWorked(ctx context.Context, tokenURL, clientID, credentials, style string) error {
	return exec(ctx, s.db, "record that the client works", `
INSERT INTO tokenguard_refusal_evidence (token_url, client_id, credentials, worked_style, worked_at)
VALUES (?, ?, ?, ?, now())
ON CONFLICT (token_url, client_id, credentials) DO UPDATE SET worked_style = EXCLUDED.worked_style, worked_at = now()`,
		tokenURL, clientID, credentials, style)
}
