package repository

import (
	"context"

	"github.com/tokenguard/tokenguard/domain"
)

// CountByStatus counts the connections that have a stored token by status,
// an active one shown failing counted as failing only, in one aggregate
// (for the metrics collected at scrape time).
func (r *TokenRepository) CountByStatus(ctx context.Context) (map[domain.Status]int, error) {
	var rows []struct {
		Status string
		N      int
	}
	err := r.db.WithContext(ctx).Raw(`SELECT CASE WHEN t.status = 'active' AND f.failing THEN 'failing' ELSE t.status END AS status, count(*) AS n
FROM tokenguard_tokens t LEFT JOIN tokenguard_refresh_failures f ON f.connection_id = t.connection_id AND f.version = t.version
GROUP BY 1`).Scan(&rows).Error
	if err != nil {
		return nil, storeError(ctx, "count connections by status", err)
	}
	out := make(map[domain.Status]int, len(rows))
	for _, row := range rows {
		out[domain.Status(row.Status)] = row.N
	}
	return out, nil
}
