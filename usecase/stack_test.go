package usecase

import (
	"context"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/internal/waitfor"
)

// At an expiry, hundreds of goroutines arrive at once, many of them new
// (a request's, a job's). A waiter's path (the cache lookup, the flight
// it joins) fits in a new goroutine's first stack: one that does not
// has its stack copied into a bigger one, and at a storm that copying
// is most of what the callers cost (BenchmarkTokenWaiters; the CPU profile
// of BenchmarkRefreshStorm).
//
// It runs in a process of its own with every goroutine's first stack at
// the runtime's minimum: by default a new goroutine's first stack is sized
// by the stacks the last GC scanned, which varies from run to run.
func TestWaitersFitTheirFirstStack(t *testing.T) {
	if os.Getenv("TOKENGUARD_FIXED_STACKS") == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestWaitersFitTheirFirstStack$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), "GODEBUG=adaptivestackstart=0", "TOKENGUARD_FIXED_STACKS=1")
		out, err := cmd.CombinedOutput()
		t.Logf("%s", out)
		if err != nil {
			t.Fatal(err)
		}
		return
	}
	// What else a busy machine does while the goroutines start only adds
	// to the measure: the best of three runs is the path's size. A path
	// that outgrew its first stack outgrows it in every run.
	var first, waiter uint64
	for range 3 {
		if first, waiter = measureStacks(t); waiter <= first*4/3 {
			// The flight's own goroutine is counted too, and it does outgrow
			// its first stack: a third more is room for it.
			return
		}
	}
	t.Errorf("a goroutine waiting in Token holds %d B of stack, one parked on a channel %d B: the waiter's path outgrew a new goroutine's first stack", waiter, first)
}

// measureStacks returns the stack per goroutine of n parked on a channel
// and of n waiting in Token for one flight.
func measureStacks(t *testing.T) (first, waiter uint64) {
	t.Helper()
	const n = 2000
	all := make(chan struct{})
	fresh := domain.Token{Connection: "acme", AccessToken: domain.NewSecret("at"), Status: domain.StatusActive, Version: 2, Expiry: time.Now().Add(time.Hour)}
	u, err := NewRefreshTokenUseCase(heldStore{all: all, tok: fresh}, nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	u.TrustCache(true)
	stale := fresh
	stale.Version, stale.Expiry = 1, time.Now().Add(-time.Minute)
	u.cache.put(stale, u.cache.begin(), time.Second)
	waiting := func() int64 {
		v, ok := u.flights.m.Load("acme")
		if !ok {
			return 0
		}
		return v.(*flight).waiters.Load()
	}

	// Both kinds start after the same GC: the runtime sizes a new
	// goroutine's first stack by the stacks it scanned in the last one.
	var stats runtime.MemStats
	inUse := func() uint64 { runtime.ReadMemStats(&stats); return stats.StackInuse }
	var wg sync.WaitGroup
	runtime.GC()
	before := inUse()
	block := make(chan struct{})
	var parked sync.WaitGroup
	parked.Add(n)
	for range n {
		wg.Go(func() { parked.Done(); <-block })
	}
	parked.Wait()
	mid := inUse()
	var wrong atomic.Int64
	for range n {
		wg.Go(func() {
			// The caller of BenchmarkRefreshStorm: its frame holds the
			// token it is handed, and nothing else.
			if _, err := u.Token(context.Background(), "acme"); err != nil {
				wrong.Add(1)
			}
		})
	}
	waitfor.Until(t, 10*time.Second, "the callers never all waited in Token", func() bool { return waiting() >= n })
	after := inUse()
	close(block)
	close(all)
	wg.Wait()
	if wrong.Load() != 0 {
		t.Fatalf("%d callers failed", wrong.Load())
	}
	first, waiter = (mid-before)/n, (after-mid)/n
	t.Logf("stack per goroutine: %d B parked on a channel, %d B waiting in Token", first, waiter)
	return first, waiter
}
