package benchreport

import (
	"bytes"
	"context"
	"runtime/trace"
	"strings"
	"sync"
	"testing"
	"time"
)

// A traced mini storm: callers in "call" regions wait for one worker that
// answers after a delay. ReadStorm counts every caller, and its figures
// are consistent with the delay; phases it cannot find are -1.
func TestReadStorm(t *testing.T) {
	const callers = 50
	const delay = 5 * time.Millisecond
	var buf bytes.Buffer
	if err := trace.Start(&buf); err != nil {
		t.Skip("tracing unavailable:", err) // another trace is running (go test -trace)
	}
	answer := make(chan struct{})
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			region := trace.StartRegion(context.Background(), "call")
			<-answer
			region.End()
		})
	}
	time.Sleep(delay)
	close(answer)
	wg.Wait()
	trace.Stop()

	s, err := ReadStorm(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if s.Calls != callers {
		t.Errorf("Calls = %d, want %d", s.Calls, callers)
	}
	if s.P50 > s.P99 || s.P99 > s.Span || s.Span < delay/2 {
		t.Errorf("p50 %v, p99 %v, span %v: want p50 <= p99 <= span, span about %v", s.P50, s.P99, s.Span, delay)
	}
	if s.WokenP50 < 0 || s.WokenP99 < s.WokenP50 {
		t.Errorf("woken callers waited p50 %v, p99 %v for a CPU: want 0 <= p50 <= p99", s.WokenP50, s.WokenP99)
	}
	if s.ToProvider != -1 || s.Provider != -1 || s.ToCommit != -1 || s.WakeAll != -1 || s.LockSent != -1 || s.Arrived != -1 || s.Release != -1 {
		t.Errorf("phases found in a trace without them: %+v", s)
	}
	if m, ok := Median([]Storm{s, {P50: -1}}, func(s Storm) time.Duration { return s.P50 }); !ok || m != s.P50 {
		t.Errorf("Median = %v, %v; want %v (a storm without the figure is skipped)", m, ok, s.P50)
	}
}

func TestReadStormWithoutCalls(t *testing.T) {
	var buf bytes.Buffer
	if err := trace.Start(&buf); err != nil {
		t.Skip("tracing unavailable:", err)
	}
	trace.Stop()
	if _, err := ReadStorm(&buf); err == nil || !strings.Contains(err.Error(), "call") {
		t.Errorf("err = %v, want one saying there is no call region", err)
	}
	if _, err := ReadStorm(strings.NewReader("not a trace")); err == nil {
		t.Error("no error for a file that is not a trace")
	}
}
