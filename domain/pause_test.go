package domain_test

import (
	"errors"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// The failing connection's pause: attempts at 0, 5, 15, 35 and 75 s, then
// one a minute.
func TestFailingPauseSchedule(t *testing.T) {
	at, attempts := time.Duration(0), []time.Duration{0}
	for n := 1; at < 3*time.Minute; n++ {
		at += domain.FailingPause.Wait(n)
		attempts = append(attempts, at)
	}
	want := []time.Duration{0, 5, 15, 35, 75, 135, 195}
	for i, w := range want {
		if attempts[i] != w*time.Second {
			t.Fatalf("attempts at %v, want %v s", attempts, want)
		}
	}
}

// A pause starts after After failures in a row, doubles at each pause
// after that up to Max, ignores failures during a pause, and ends with a
// success.
func TestPauseDoublesAndEnds(t *testing.T) {
	p := domain.Pause{Policy: domain.PausePolicy{After: 2, First: time.Second, Max: 3 * time.Second}}
	now := time.Unix(0, 0)
	boom := errors.New("refused")
	if p.Fail(now, boom) {
		t.Fatal("paused after one failure, want two")
	}
	var pauses []time.Duration
	for range 4 {
		if !p.Fail(now, boom) {
			t.Fatalf("no pause at %v", now)
		}
		left, cause := p.Check(now)
		if !errors.Is(cause, boom) {
			t.Fatalf("cause %v", cause)
		}
		if p.Fail(now.Add(left/2), boom) {
			t.Fatal("a failure during the pause lengthened it")
		}
		pauses = append(pauses, left)
		now = now.Add(left)
	}
	if want := []time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 3 * time.Second}; !equal(pauses, want) {
		t.Fatalf("pauses %v, want %v", pauses, want)
	}
	p.Fail(now, boom)
	p.Succeed()
	if left, cause := p.Check(now); left != 0 || cause != nil {
		t.Fatalf("after a success: %v, %v", left, cause)
	}
	if p.Fail(now, boom) {
		t.Fatal("a success did not reset the failures in a row")
	}
}

func equal(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
