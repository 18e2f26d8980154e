package repository

import (
	"context"
	"fmt"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// ExpiringBefore lists, without credentials, up to limit active tokens expiring before t, soonest
// first, after the cursor after ("" first); next is the following page's ("" after the last).
func (r *TokenRepository) ExpiringBefore(ctx context.Context, t time.Time, after string, limit int) (due []domain.Token, next string, err error) {
	return r.activeBefore(ctx, "expiry", t, after, limit)
}

// ObtainedBefore is ExpiringBefore for tokens obtained before t, oldest first.
func (r *TokenRepository) ObtainedBefore(ctx context.Context, t time.Time, after string, limit int) (due []domain.Token, next string, err error) {
	return r.activeBefore(ctx, "obtained_at", t, after, limit)
}

// activeBefore pages through the active tokens whose column is before t, by (column, connection
// id). The cursor carries when the walk began: a token obtained later is left out, or a window
// longer than the tokens' lifetime would meet every refreshed token again further on.
func (r *TokenRepository) activeBefore(ctx context.Context, column string, t time.Time, after string, limit int) ([]domain.Token, string, error) {
	q, args := `t.`+column+` < ?`, []any{t}
	var began *time.Time // NULL on the first page: the statement's now()
	// The cursor: "<began>:<the last row's time>:<its connection id>", times in Unix microseconds.
	if after != "" {
		var b, from int64
		var id int32
		if _, err := fmt.Sscanf(after, "%d:%d:%d", &b, &from, &id); err != nil {
			return nil, "", fmt.Errorf("list tokens: malformed cursor %q", after)
		}
		began = new(time.UnixMicro(b))
		q, args = q+` AND (t.`+column+`, t.connection_id) > (?, ?)`, append(args, time.UnixMicro(from), id)
	}
	var rows []struct {
		Token tokenRow `gorm:"embedded"`
		At    time.Time
		Began time.Time
	}
	err := r.db.WithContext(ctx).Raw(`SELECT c.id AS lock_key, c.name, `+recordFields+failureColumns+`, t.`+column+` AS at, b.began
		`+tokenFrom+`, (SELECT coalesce(?::timestamptz, now()) AS began) b
		WHERE t.status = 'active' AND t.obtained_at < b.began AND `+q+`
		ORDER BY t.`+column+`, t.connection_id LIMIT ?`, append(append([]any{began}, args...), limit)...).Find(&rows).Error
	if err != nil {
		return nil, "", storeError(ctx, "list tokens by "+column, err)
	}
	due := make([]domain.Token, len(rows))
	for i, row := range rows {
		r.ids.put(&row.Token)
		due[i] = row.Token.record()
	}
	next := ""
	if len(rows) == limit && limit > 0 {
		last := rows[len(rows)-1]
		next = fmt.Sprintf("%d:%d:%d", last.Began.UnixMicro(), last.At.UnixMicro(), last.Token.LockKey)
	}
	return due, next, nil
}
