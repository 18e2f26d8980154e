package repository

import (
	"context"

	"github.com/tokenguard/tokenguard/domain"
)

// CountByStatus counts the connections that have a stored token, by
// status. It is one aggregate over the tokenguard_tokens table (its primary key is
// the connection), for the metrics collected at scrape time; connections
// registered without a token yet are not counted.
func (r *TokenRepository) CountByStatus(ctx context.Context) (map[domain.Status]int, error) {
	var rows []struct {
		Status string
		N      int
	}
	err := r.db.WithContext(ctx).Raw("SELECT status, count(*) AS n FROM tokenguard_tokens GROUP BY status").Scan(&rows).Error
	if err != nil {
		return nil, storeError(ctx, "count connections by status", err)
	}
	out := make(map[domain.Status]int, len(rows))
	for _, row := range rows {
		out[domain.Status(row.Status)] = row.N
	}
	return out, nil
}
