package usecase

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"

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
//
// Joining a flight takes no lock: at an expiry every goroutine of the
// process arrives at once, and a mutex would queue them behind each other
// (and behind whichever holder the OS preempted) while the flight's own
// answer from the database waits for a free CPU.
type flights struct {
	m       sync.Map     // key -> *flight
	log     *slog.Logger // receives recovered panics; nil: slog.Default()
	running running      // flights whose work has not returned
}

type flight struct {
	done    chan struct{}
	tok     domain.Token // set before done is closed
	err     error
	waiters atomic.Int64 // callers still waiting; 0 once abandoned, for good
	cancel  context.CancelFunc
}

// addWaiter counts one more waiter unless every waiter has left already.
func (fl *flight) addWaiter() bool {
	for {
		n := fl.waiters.Load()
		if n == 0 {
			return false
		}
		if fl.waiters.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// do runs fn once for key at a time and returns the finished flight, whose
// tok and err are fn's answer, or ctx's error if the caller gave up first.
// fn's context keeps ctx's values and is cancelled when all callers have
// left; fn bounds each of its steps itself (a refresh may first queue for
// a slot, and must not time out while the queue moves).
//
// It hands back a pointer, not a copy of the token: every frame on a
// waiter's path counts (RefreshTokenUseCase.Token, which does join and
// wait itself, one frame less).
func (f *flights) do(ctx context.Context, key string,
	fn func(context.Context) (domain.Token, error)) (*flight, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return f.wait(ctx, key, f.join(ctx, key, fn))
}

// join returns key's flight with the caller counted as a waiter, starting
// one if there is none.
func (f *flights) join(ctx context.Context, key string,
	fn func(context.Context) (domain.Token, error)) *flight {
	for {
		v, ok := f.m.Load(key)
		if !ok {
			if fl := f.start(ctx, key, fn); fl != nil {
				return fl
			}
			continue // another caller started it first
		}
		fl := v.(*flight)
		if fl.addWaiter() {
			return fl
		}
		f.m.CompareAndDelete(key, fl) // abandoned: start another
	}
}

// wait waits for fl, the flight of key the caller joined, and returns it
// finished, or ctx's error if the caller gave up first: the last caller to
// give up cancels its work.
//
//go:noinline
func (f *flights) wait(ctx context.Context, key string, fl *flight) (*flight, error) {
	if ctx.Done() == nil { // a context that is never cancelled: no select
		<-fl.done
		return fl, nil
	}
	select {
	case <-fl.done:
		return fl, nil
	case <-ctx.Done():
		if fl.waiters.Add(-1) == 0 {
			// Nobody wants the answer: stop waiting for the lock. A refresh
			// already sent to the provider still completes (see refresh).
			fl.cancel()
			f.m.CompareAndDelete(key, fl)
		}
		return nil, ctx.Err()
	}
}

// start starts key's flight with the caller as its waiter, or returns nil
// if another caller started one first. It is a frame of its own, on the
// stack of the one caller that starts the flight, not of those that join it
// (see RefreshTokenUseCase.Token).
//
//go:noinline
func (f *flights) start(ctx context.Context, key string,
	fn func(context.Context) (domain.Token, error)) *flight {
	fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	fl := &flight{done: make(chan struct{}), cancel: cancel}
	fl.waiters.Store(1)
	if _, taken := f.m.LoadOrStore(key, fl); taken {
		cancel()
		return nil
	}
	f.running.add()
	go func() {
		defer f.running.done()
		defer cancel()
		fl.tok, fl.err = f.run(fctx, key, fn)
		f.m.CompareAndDelete(key, fl)
		close(fl.done)
	}()
	return fl
}

// run calls fn, turning a panic into an error: the flight runs on a
// goroutine of its own, where a panic would end the process and leave its
// waiters hanging. The panic's value is logged only when it is a runtime
// error; any other value might hold a token.
func (f *flights) run(ctx context.Context, key string, fn func(context.Context) (domain.Token, error)) (t domain.Token, err error) {
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		what := fmt.Sprintf("%T", r)
		if re, ok := r.(runtime.Error); ok {
			what = re.Error()
		}
		log := f.log
		log = cmp.Or(log, slog.Default())
		log.Error("panic in a token refresh, recovered", "flight", key, "panic", what, "stack", string(debug.Stack()))
		t, err = domain.Token{}, fmt.Errorf("token refresh panicked (%s)", what)
	}()
	return fn(ctx)
}

// announcements wakes the callers waiting for another process's refresh
// of a connection when the change listener hears of it (a rotated token
// stored, a lease released).
type announcements struct {
	mu sync.Mutex
	m  map[string]*announcement
}

type announcement struct {
	ch       chan struct{}
	watchers int
}

// watch returns a channel closed at connection's next announcement, and a
// func to call when the caller no longer waits for it. Watch before
// looking: an announcement between the look and the wait is not missed.
func (a *announcements) watch(connection string) (<-chan struct{}, func()) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.m == nil {
		a.m = map[string]*announcement{}
	}
	w := a.m[connection]
	if w == nil {
		w = &announcement{ch: make(chan struct{})}
		a.m[connection] = w
	}
	w.watchers++
	return w.ch, func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		if w.watchers--; w.watchers == 0 && a.m[connection] == w {
			delete(a.m, connection)
		}
	}
}

// announce wakes connection's watchers.
func (a *announcements) announce(connection string) {
	a.mu.Lock()
	w := a.m[connection]
	delete(a.m, connection)
	a.mu.Unlock()
	if w != nil {
		close(w.ch)
	}
}
