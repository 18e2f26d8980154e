package usecase

import (
	"context"
	"sync"
)

// Drain waits until no read or refresh of this use case is running, or ctx
// ends. Call it before closing the pool at shutdown: a refresh runs on
// after its callers gave up, and its rotated token must reach the database.
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
