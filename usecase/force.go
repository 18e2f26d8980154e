package usecase

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// ForceRefresh is for a caller whose request was answered 401 with the
// token of version failed (its access token was revoked, typically by a
// refresh in another process). It returns a newer token: the stored one if
// some process already stored it, otherwise one refreshed now under the
// connection's lock, but only if the stored version is still failed, so a
// burst of 401s causes one refresh, not many. Like Token, it returns no
// refresh token.
//
// Forced refreshes of one connection are limited to one per ForceInterval
// (or half the token's granted lifetime, if shorter) in this process;
// beyond that it fails with domain.ErrRefreshRateLimited rather than let an
// API that always answers 401 drive a refresh loop. Only a refresh that
// would call the provider counts: a 401 for a token another process has
// just replaced never does.
func (u *RefreshTokenUseCase) ForceRefresh(ctx context.Context, connection string, failed int64) (domain.Token, error) {
	u.opts.Observer.ForcedRefresh(connection)
	u.cache.invalidate(connection, failed+1) // never hand out the failed token again
	key := connection + "\x00" + strconv.FormatInt(failed, 10)
	ctx, span := u.opts.Tracer.Start(ctx, StepToken, connection)
	fl, err := u.flights.do(ctx, key, func(ctx context.Context) (domain.Token, error) {
		epoch := u.cache.begin()
		due := func(t domain.Token) bool { return t.Version == failed }
		// A refresh under way brings the newer token: look waits for it
		// before this process judges whether it may present the refresh token.
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
