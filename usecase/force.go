package usecase

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// ForceRefresh returns a token newer than version failed, answered 401:
// the stored one, or one refreshed now if failed is still stored (a burst of
// 401s causes one refresh), without its refresh token. Refreshes that call
// the provider are limited per connection (domain.ErrRefreshRateLimited).
func (u *RefreshTokenUseCase) ForceRefresh(ctx context.Context, connection string, failed int64) (domain.Token, error) {
	u.opts.Observer.ForcedRefresh(connection)
	u.cache.invalidate(connection, failed+1) // never hand out the failed token again
	key := connection + "\x00" + strconv.FormatInt(failed, 10)
	ctx, span := u.opts.Tracer.Start(ctx, StepToken, connection)
	fl, err := u.flights.do(ctx, key, func(ctx context.Context) (domain.Token, error) {
		epoch := u.cache.begin()
		due := func(t domain.Token) bool { return t.Version == failed }
		// A refresh under way brings the newer token: look waits for it.
		t, _, err := u.look(ctx, connection, time.Now(), due, true, nil)
		if err != nil {
			return domain.Token{}, err
		}
		if t.Status == domain.StatusNeedsReauth {
			return domain.Token{}, needsReauth(t)
		}
		if due(t) {
			if t, err = u.refresh(ctx, connection, true, due, t); err != nil {
				return domain.Token{}, fmt.Errorf("forced refresh: %w", err)
			}
		}
		u.cache.put(t, epoch, u.skewOf(t))
		return t, nil
	})
	if err == nil {
		err = fl.err
	}
	if err != nil {
		span.End(Facts{Forced: true, OldVersion: failed}, err)
		return domain.Token{}, fmt.Errorf("token for %s after version %d failed: %w", connection, failed, err)
	}
	span.End(Facts{Forced: true, Provider: fl.tok.Provider, OldVersion: failed, NewVersion: fl.tok.Version}, nil)
	return withoutRefreshToken(fl.tok), nil
}
