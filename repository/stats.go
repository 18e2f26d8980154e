package repository

import (
	"context"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
)

// CountByStatus counts the connections that have a stored token by status, an active one shown
// failing counted as failing only, in one aggregate (for the metrics at scrape time).
func (r *TokenRepository) CountByStatus(ctx context.Context) (map[domain.Status]int, error) {
	return counted[domain.Status](ctx, r.db, "count connections by status", `SELECT CASE WHEN t.status = 'active' AND f.failing THEN 'failing' ELSE t.status END AS key, count(*) AS n
FROM tokenguard_tokens t LEFT JOIN tokenguard_refresh_failures f ON f.connection_id = t.connection_id AND f.version = t.version
GROUP BY 1`)
}

// counted reads the (key, n) rows of a statement as a map.
func counted[K ~string](ctx context.Context, db *gorm.DB, op, sql string) (map[K]int, error) {
	return keyedRows(ctx, db, op, func(row count[K]) (K, int) { return row.Key, row.N }, sql)
}

type count[K ~string] struct {
	Key K
	N   int
}
