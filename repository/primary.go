package repository

import (
	"context"
	"fmt"

	"github.com/tokenguard/tokenguard/domain"
)

// CheckPrimary fails with domain.ErrReadOnlyStore on a replica, so that a process fails at start-up.
func (r *TokenRepository) CheckPrimary(ctx context.Context) error {
	recovering, err := scan[bool](ctx, r.db, "check the database is a primary", "SELECT pg_is_in_recovery()")
	if err != nil {
		return err
	}
	if recovering {
		return fmt.Errorf("%w: pg_is_in_recovery() is true, and every refresh must be stored: connect to the primary", domain.ErrReadOnlyStore)
	}
	return nil
}
