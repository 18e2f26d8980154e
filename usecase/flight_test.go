package usecase

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/internal/waitfor"
)

func TestFlightRunsOnceForAllWaiters(t *testing.T) {
	var f flights
	var runs atomic.Int64
	release := make(chan struct{})
	fn := func(context.Context) (domain.Token, error) {
		runs.Add(1)
		<-release
		return domain.Token{Version: 7}, nil
	}
	var wg sync.WaitGroup
	for range 100 {
		wg.Go(func() {
			fl, err := f.do(context.Background(), "acme", fn)
			if err != nil || fl.err != nil || fl.tok.Version != 7 {
				t.Errorf("do = %+v, %v", fl, err)
			}
		})
	}
	waitfor.Until(t, 5*time.Second, "condition not reached", func() bool { return waiters(&f, "acme") == 100 })
	close(release)
	wg.Wait()
	if n := runs.Load(); n != 1 {
		t.Fatalf("fn ran %d times for one flight", n)
	}
	// The flight is over: the next call runs fn again.
	if _, err := f.do(context.Background(), "acme", fn); err != nil || runs.Load() != 2 {
		t.Fatalf("after the flight: %v, %d runs", err, runs.Load())
	}
}

func TestFlightOutlivesAWaiterWhoLeaves(t *testing.T) {
	var f flights
	release := make(chan struct{})
	workCtx := make(chan context.Context, 1)
	fn := func(ctx context.Context) (domain.Token, error) {
		workCtx <- ctx
		<-release
		return domain.Token{Version: 3}, nil
	}
	ctx, leave := context.WithCancel(context.Background())
	left := make(chan error, 1)
	go func() { _, err := f.do(ctx, "acme", fn); left <- err }()
	wctx := <-workCtx
	stay := make(chan *flight, 1)
	go func() { fl, _ := f.do(context.Background(), "acme", fn); stay <- fl }()
	waitfor.Until(t, 5*time.Second, "condition not reached", func() bool { return waiters(&f, "acme") == 2 })

	leave()
	if err := <-left; !errors.Is(err, context.Canceled) {
		t.Fatalf("the waiter who left got %v", err)
	}
	if wctx.Err() != nil {
		t.Fatal("the work was cancelled while a waiter still wanted it")
	}
	close(release)
	if fl := <-stay; fl.tok.Version != 3 {
		t.Fatalf("the waiter who stayed got %+v", fl)
	}
}

func TestFlightNobodyWantsIsCancelledAndReplaced(t *testing.T) {
	var f flights
	workCtx := make(chan context.Context, 1)
	ctx, leave := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := f.do(ctx, "acme", func(ctx context.Context) (domain.Token, error) {
			workCtx <- ctx
			<-ctx.Done() // a lock wait
			return domain.Token{}, ctx.Err()
		})
		done <- err
	}()
	wctx := <-workCtx
	leave()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("do = %v", err)
	}
	select {
	case <-wctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the work nobody waits for was not cancelled")
	}
	// A new caller does not join the abandoned flight.
	fl, err := f.do(context.Background(), "acme", func(context.Context) (domain.Token, error) {
		return domain.Token{Version: 9}, nil
	})
	if err != nil || fl.tok.Version != 9 {
		t.Fatalf("after the abandoned flight: %+v, %v", fl, err)
	}
}

func waiters(f *flights, key string) int64 {
	v, ok := f.m.Load(key)
	if !ok {
		return 0
	}
	return v.(*flight).waiters.Load()
}

// BenchmarkTokenWaiters: as at an expiry, fresh goroutines find the cached
// token stale at the same moment and join the process's one flight to the
// store, which answers once every goroutine has arrived. One op is one
// goroutine's share of the time until the last of them has started: the
// time the flood keeps the process's CPUs busy, while the flight's own
// answer from the database waits for a free one (the scheduler polls the
// network only when it runs out of goroutines). The baseline "once" is the
// least a waiter can cost: the same goroutines waiting in a
// sync.OnceValue. Compare the ratio, not the figures.
func BenchmarkTokenWaiters(b *testing.B) {
	const n = 200
	flood := func(b *testing.B, setup func(all <-chan struct{}) func()) {
		for done := 0; done < b.N; done += n {
			b.StopTimer()
			all := make(chan struct{})
			call := setup(all)
			var arrived atomic.Int64
			start := make(chan struct{})
			var wg sync.WaitGroup
			for range n {
				wg.Go(func() {
					<-start
					if arrived.Add(1) == n {
						close(all)
					}
					call()
				})
			}
			b.StartTimer()
			close(start)
			<-all
			b.StopTimer()
			wg.Wait()
		}
	}
	b.Run("tokenguard", func(b *testing.B) {
		flood(b, func(all <-chan struct{}) func() {
			fresh := domain.Token{Connection: "acme", AccessToken: domain.NewSecret("at"), Status: domain.StatusActive, Version: 2, Expiry: time.Now().Add(time.Hour)}
			u, err := NewRefreshTokenUseCase(heldStore{all: all, tok: fresh}, nil, Options{})
			if err != nil {
				b.Fatal(err)
			}
			u.TrustCache(true)
			stale := fresh
			stale.Version, stale.Expiry = 1, time.Now().Add(-time.Minute)
			u.cache.put(stale, u.cache.begin(), time.Second)
			return func() {
				if _, err := u.Token(context.Background(), "acme"); err != nil {
					b.Error(err)
				}
			}
		})
	})
	b.Run("once", func(b *testing.B) {
		flood(b, func(all <-chan struct{}) func() {
			once := sync.OnceValue(func() error { <-all; return nil })
			return func() { _ = once() }
		})
	})
}

// heldStore answers the claim's re-read with tok once all is closed, as a
// store whose lock holder has just refreshed.
type heldStore struct {
	all <-chan struct{}
	tok domain.Token
}

func (s heldStore) Read(context.Context, string) (domain.Token, Lease, error) {
	return s.tok, Lease{}, nil
}

func (s heldStore) Claim(context.Context, domain.Token, time.Duration) (Claim, error) {
	<-s.all
	return Claim{Token: s.tok}, nil
}

func (s heldStore) Store(context.Context, domain.Token) (domain.Token, error) {
	return domain.Token{}, errors.New("not used")
}

func (s heldStore) Fail(context.Context, domain.Token, domain.RefreshFailure) error {
	panic("heldStore records no failure")
}

// A panic inside the work reaches every waiter as an error, is logged with
// its stack, and never shows a panic value that could hold a token.
func TestFlightRecoversAPanic(t *testing.T) {
	var buf lockedBuffer
	f := flights{log: slog.New(slog.NewTextHandler(&buf, nil))}
	for _, boom := range []func(){
		func() { panic("rt-secret-in-panic") },
		func() { var s []int; i := 1; _ = s[i] },
		func() { var p *domain.Token; _ = p.Version },
	} {
		fl, err := f.do(context.Background(), "acme", func(context.Context) (domain.Token, error) {
			boom()
			return domain.Token{}, nil
		})
		if err != nil || fl.err == nil || !strings.Contains(fl.err.Error(), "panicked") {
			t.Fatalf("do = %v, flight err %v; want a panic error", err, fl.err)
		}
	}
	out := buf.String()
	if strings.Contains(out, "rt-secret-in-panic") {
		t.Errorf("panic value logged: %s", out)
	}
	if !strings.Contains(out, "nil pointer dereference") || !strings.Contains(out, "index out of range") || !strings.Contains(out, "flight_test.go") {
		t.Errorf("log lacks the runtime errors or the stack: %s", out)
	}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
