package repository

import (
	"context"

	"gorm.io/gorm"
)

// AuthStyles remembers, per token URL and client id, the client authentication style a token
// endpoint accepted, so that no process probes.
type AuthStyles struct{ db *gorm.DB }

// NewAuthStyles binds the store to a pool.
func NewAuthStyles(db *gorm.DB) *AuthStyles { return &AuthStyles{db: db} }

// Load returns the remembered style, or "" when there is none.
func (s *AuthStyles) Load(ctx context.Context, tokenURL, clientID string) (string, error) {
	var styles []string
	err := s.db.WithContext(ctx).
		Raw("SELECT style FROM tokenguard_client_auth_styles WHERE token_url = ? AND client_id = ?", tokenURL, clientID).
		Find(&styles).Error
	if err != nil || len(styles) == 0 {
		return "", storeError(ctx, "load client auth style", err)
	}
	return styles[0], nil
}

// Save remembers style, replacing what was remembered.
func (s *AuthStyles) Save(ctx context.Context, tokenURL, clientID, style string) error {
	return exec(ctx, s.db, "save client auth style", `
INSERT INTO tokenguard_client_auth_styles (token_url, client_id, style) VALUES (?, ?, ?)
ON CONFLICT (token_url, client_id) DO UPDATE SET style = EXCLUDED.style, updated_at = now()`,
		tokenURL, clientID, style)
}
