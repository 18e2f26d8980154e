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

// flights lets one goroutine per connection do the slow path while the others wait for its
// result. Unlike x/sync/singleflight, the work runs on its own context, cancelled only when every
// waiter has gone. Joining takes no lock: at an expiry every goroutine arrives at once, and a
// mutex would queue them while the flight's answer waits for a free CPU.
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
	for n := fl.waiters.Load(); n > 0; n = fl.waiters.Load() {
		if fl.waiters.CompareAndSwap(n, n+1) {
			return true
		}
	}
	return false
}

// do runs fn once for key at a time and returns the finished flight (see wait). fn's context keeps
// ctx's values and ends when all callers have left.
func (f *flights) do(ctx context.Context, key string, fn func(context.Context) (domain.Token, error)) (*flight, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return f.wait(ctx, key, f.join(ctx, key, fn))
}

// join returns key's flight, started if there is none, with the caller counted as a waiter.
func (f *flights) join(ctx context.Context, key string, fn func(context.Context) (domain.Token, error)) *flight {
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

// wait returns fl finished, or ctx's error if the caller gave up first: the last one cancels its work.
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
			// Nobody wants the answer: stop waiting for the lock (a refresh sent still completes).
			fl.cancel()
			f.m.CompareAndDelete(key, fl)
		}
		return nil, ctx.Err()
	}
}

// start starts key's flight with the caller as its waiter, or returns nil if another caller started
// one first. A frame of its own, so joiners' stacks stay small (see RefreshTokenUseCase.Token).
//
//go:noinline
func (f *flights) start(ctx context.Context, key string, fn func(context.Context) (domain.Token, error)) *flight {
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

// run calls fn, turning a panic into an error. The panic's value is logged only when it is a
// runtime error; any other value might hold a token.
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
		cmp.Or(f.log, slog.Default()).Error("panic in a token refresh, recovered",
			"flight", key, "panic", what, "stack", string(debug.Stack()))
		t, err = domain.Token{}, fmt.Errorf("token refresh panicked (%s)", what)
	}()
	return fn(ctx)
}

// announcements wakes the callers waiting for another process's refresh when the change listener hears of it.
type announcements struct {
	mu sync.Mutex
	m  map[string]*announcement
}

type announcement struct {
	ch       chan struct{}
	watchers int
}

// watch returns a channel closed at connection's next announcement, and a func to call when no
// longer waiting. Watch before looking.
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

func (a *announcements) announce(connection string) {
	a.mu.Lock()
	w := a.m[connection]
	delete(a.m, connection)
	a.mu.Unlock()
	if w != nil {
		close(w.ch)
	}
}

// Drain waits until no read or refresh of this use case is running, or ctx ends. Call it before
// closing the pool at shutdown: a refresh runs on after its callers gave up, and its rotated token
// must reach the database.
func (u *RefreshTokenUseCase) Drain(ctx context.Context) error {
	return u.flights.running.wait(ctx)
}

// running counts work in flight; wait returns when it is none.
type running struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to 0; nil while n is 0
}

func (r *running) add() {
	r.mu.Lock()
	if r.n == 0 {
		r.idle = make(chan struct{})
	}
	r.n++
	r.mu.Unlock()
}

func (r *running) done() {
	r.mu.Lock()
	r.n--
	if r.n == 0 {
		close(r.idle)
		r.idle = nil
	}
	r.mu.Unlock()
}

func (r *running) wait(ctx context.Context) error {
	r.mu.Lock()
	idle := r.idle
	r.mu.Unlock()
	if idle == nil {
		return nil
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
