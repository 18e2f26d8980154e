package usecase

import (
	"context"
	"sync"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// flights lets one goroutine per connection do the slow path (read, and
// maybe lock and refresh) while the others wait for its result, so a
// process holds at most one database connection per connection's refresh.
//
// x/sync/singleflight runs the work on the first caller's context: if that
// caller gives up, everyone fails, and if it is not cancelled nobody can
// stop the wait. Here the work runs on its own context, and is cancelled
// only when every waiter has gone, which ends a lock wait nobody needs.
type flights struct {
	mu sync.Mutex
	m  map[string]*flight
}

type flight struct {
	done    chan struct{}
	tok     domain.Token
	err     error
	waiters int
	cancel  context.CancelFunc
}

// do runs fn once for key at a time. fn's context keeps ctx's values, is
// bounded by limit, and is cancelled when all callers have left.
func (f *flights) do(ctx context.Context, key string, limit time.Duration,
	fn func(context.Context) (domain.Token, error)) (domain.Token, error) {
	if err := ctx.Err(); err != nil {
		return domain.Token{}, err
	}
	f.mu.Lock()
	if f.m == nil {
		f.m = make(map[string]*flight)
	}
	fl, ok := f.m[key]
	if !ok {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), limit)
		fl = &flight{done: make(chan struct{}), cancel: cancel}
		f.m[key] = fl
		go func() {
			tok, err := fn(fctx)
			f.mu.Lock()
			if f.m[key] == fl {
				delete(f.m, key)
			}
			fl.tok, fl.err = tok, err
			f.mu.Unlock()
			close(fl.done)
			cancel()
		}()
	}
	fl.waiters++
	f.mu.Unlock()

	select {
	case <-fl.done:
		return fl.tok, fl.err
	case <-ctx.Done():
		f.mu.Lock()
		fl.waiters--
		if fl.waiters == 0 {
			// Nobody wants the answer: stop waiting for the lock. A refresh
			// already sent to the provider still completes (see refresh).
			fl.cancel()
			if f.m[key] == fl {
				delete(f.m, key)
			}
		}
		f.mu.Unlock()
		return domain.Token{}, ctx.Err()
	}
}
