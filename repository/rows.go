package repository

import (
	"database/sql"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// tokenRow is the tokens table joined with the connection's name. It stays
// inside this package: the rest of the code only sees domain.Token.
type tokenRow struct {
	LockKey      int32
	Name         string
	AccessToken  string
	TokenType    string
	RefreshToken string
	Expiry       sql.NullTime
	ObtainedAt   time.Time
	Version      int64
	Status       string
	StatusReason string
	UpdatedAt    time.Time
}

func (r tokenRow) domain() domain.Token {
	return domain.Token{
		ConnectionID: r.Name,
		AccessToken:  domain.NewSecret(r.AccessToken),
		TokenType:    r.TokenType,
		RefreshToken: domain.NewSecret(r.RefreshToken),
		Expiry:       r.Expiry.Time,
		ObtainedAt:   r.ObtainedAt,
		Version:      r.Version,
		Status:       domain.Status(r.Status),
		StatusReason: r.StatusReason,
		UpdatedAt:    r.UpdatedAt,
	}
}

func nullTime(t time.Time) sql.NullTime { return sql.NullTime{Time: t, Valid: !t.IsZero()} }
