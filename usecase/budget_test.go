package usecase

import (
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// The refreshes a spent budget holds back go soonest expiry first, once
// each; the provider's goroutine is started once and ends with its queue.
func TestQueueSoonestExpiryFirst(t *testing.T) {
	now := time.Now()
	var q providerState
	starts := 0
	for i, min := range []int{5, 1, 3, 1, 4} {
		tok := domain.Token{Connection: string(rune('a' + i)), Provider: "p", Expiry: now.Add(time.Duration(min) * time.Minute)}
		if i == 3 {
			tok.Connection = "b" // queued again: once
		}
		if q.push(tok) {
			starts++
		}
	}
	var got string
	for {
		tok, ok := q.pop()
		if !ok {
			break
		}
		got += tok.Connection
	}
	if got != "bcea" || starts != 1 {
		t.Errorf("popped %q with %d starts, want bcea and 1", got, starts)
	}
	if !q.push(domain.Token{Connection: "a", Provider: "p"}) {
		t.Error("the provider's goroutine ended with its queue; a push after must start it again")
	}
}
