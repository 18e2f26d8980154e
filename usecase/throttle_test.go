package usecase

import (
	"fmt"
	"testing"
	"time"
)

func TestThrottleForgetsOldKeysAndStaysBounded(t *testing.T) {
	th := throttle{keep: time.Second, limit: 1000}
	now := time.Unix(1_700_000_000, 0)
	// A key is throttled for its interval, then allowed again.
	if !th.allow("a", now, time.Second) || th.allow("a", now.Add(500*time.Millisecond), time.Second) || !th.allow("a", now.Add(time.Second), time.Second) {
		t.Fatal("one key: not one event per interval")
	}
	// Many keys over time: the old ones are forgotten.
	for i := range 100_000 {
		at := now.Add(time.Duration(i) * time.Millisecond) // 1,000 keys a second
		if !th.allow(fmt.Sprint("k", i), at, time.Second) && i < 900 {
			t.Fatalf("key %d refused while under the limit", i)
		}
		if len(th.last) > th.limit {
			t.Fatalf("%d keys held, limit %d", len(th.last), th.limit)
		}
	}
	// A burst of new keys within one interval: at most limit are held,
	// and the rest are refused, not remembered.
	burst := now.Add(time.Hour)
	refused := 0
	for i := range 3000 {
		if !th.allow(fmt.Sprint("b", i), burst, time.Second) {
			refused++
		}
	}
	if len(th.last) > th.limit || refused < 2000 {
		t.Fatalf("burst: %d held (limit %d), %d refused", len(th.last), th.limit, refused)
	}
	// A key held keeps being throttled, whatever the size.
	if th.allow("b0", burst.Add(time.Millisecond), time.Second) {
		t.Error("a held key was let through inside its interval")
	}
}
