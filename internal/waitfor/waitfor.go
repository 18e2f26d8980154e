// Package waitfor is the tests' one way to wait for an event instead of
// for a time: poll a condition until it holds, and fail the test, saying
// what did not happen, when the bound passes first.
package waitfor

import (
	"testing"
	"time"
)

// every is how often the condition is polled.
const every = 10 * time.Millisecond

// Until polls ok until it holds, or fails t with what once within has
// passed.
func Until(t testing.TB, within time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s (waited %v)", what, within)
		}
		time.Sleep(every)
	}
}
