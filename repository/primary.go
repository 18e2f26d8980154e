package repository

import (
	"context"
	"fmt"

	"github.com/tokenguard/tokenguard/domain"
)

// CheckPrimary fails with domain.ErrReadOnlyStore on a replica, so that a process fails at start-up.
func (r *TokenRepository) CheckPrimary(ctx context.Context) error {
	var recovering bool
	if err := r.db.WithContext(ctx).Raw("SELECT pg_is_in_recovery()").Scan(&recovering).Error; err != nil {
		return storeError(ctx, "check the database is a primary", err)
	}
	if recovering {
		return fmt.Errorf("%w: pg_is_in_recovery() is true, and every refresh must be stored: connect to the primary", domain.ErrReadOnlyStore)
	}
	return nil
}
