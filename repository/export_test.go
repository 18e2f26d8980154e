package repository

import (
	"context"

	"github.com/tokenguard/tokenguard/domain"
)

// NewDurabilityUnchecked holds level without ParseSyncCommit's check, for
// a test that the level reaches the server.
func NewDurabilityUnchecked(level string) *Durability { return &Durability{configured: level} }

// List reads every stored token into memory, by connection name.
func (r *TokenRepository) List(ctx context.Context) ([]domain.Token, error) {
	var out []domain.Token
	err := r.Each(ctx, func(t domain.Token) error { out = append(out, t); return nil })
	return out, err
}

// WriteNothingBack turns off the write-back of rotations the server lost (kept.go): its test's control.
func (r *TokenRepository) WriteNothingBack() {
	r.leases.writeBack = func(context.Context, []keptRotation) error { return nil }
}
