package sandbox

import (
	"fmt"
	"testing"
)

// Refreshes of different grants never wait for each other: a caller can
// hold the locks of any number of grants at once (locks shared by hash
// would make one grant's refresh wait out another's latency).
func TestGrantLocksAreOneAGrant(t *testing.T) {
	var k keyedLocks
	var unlocks []func()
	for i := range 5000 {
		unlocks = append(unlocks, k.lock(fmt.Sprintf("grant-%d", i)))
	}
	for _, unlock := range unlocks {
		unlock()
	}
	if n := len(k.locks); n != 0 {
		t.Fatalf("%d locks kept after every holder left", n)
	}
}

// Two refreshes of one grant take turns.
func TestGrantLockExcludes(t *testing.T) {
	var k keyedLocks
	unlock := k.lock("g")
	got := make(chan func())
	go func() { got <- k.lock("g") }()
	for waiting := false; !waiting; {
		k.mu.Lock()
		waiting = k.locks["g"].users == 2
		k.mu.Unlock()
	}
	select {
	case <-got:
		t.Fatal("a second holder took the grant's lock while the first held it")
	default:
	}
	unlock()
	(<-got)()
	if n := len(k.locks); n != 0 {
		t.Fatalf("%d locks kept", n)
	}
}
