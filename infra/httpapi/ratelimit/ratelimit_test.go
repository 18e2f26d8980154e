package ratelimit

import (
	"net/http/httptest"
	"testing"
	"time"
)

func TestTakeAndAcquire(t *testing.T) {
	now := time.Now()
	l := New[string](1, 2, 0, 0)
	for i := range 2 {
		if d := l.Take("a", now); d != 0 {
			t.Fatalf("burst 2: take %d waits %v", i+1, d)
		}
	}
	if d := l.Take("a", now); d <= 0 || d > time.Second {
		t.Errorf("third take: wait %v, want (0, 1s]", d)
	}
	if l.Take("b", now) != 0 {
		t.Error("another key has its own bucket")
	}

	l = New[string](1000, 1000, 2, 3)
	r1, _ := l.Acquire("a")
	r2, _ := l.Acquire("a")
	if r1 == nil || r2 == nil {
		t.Fatal("two at once are allowed")
	}
	if r, wait := l.Acquire("a"); r != nil || wait != time.Second {
		t.Errorf("a third at once: release %v, wait %v", r != nil, wait)
	}
	r3, _ := l.Acquire("b")
	if r, _ := l.Acquire("c"); r3 == nil || r != nil {
		t.Error("total of 3: the fourth request across keys must be refused")
	}
	r1()
	if r, _ := l.Acquire("a"); r == nil {
		t.Error("a released request makes room")
	}
}

func TestForgetsIdleKeysWhenFull(t *testing.T) {
	l := New[int](1, 1, 1, 0)
	busy, _ := l.Acquire(-1)
	now := time.Now()
	for i := range maxKeys + 10 {
		l.Take(i, now)
	}
	if len(l.keys) > maxKeys {
		t.Errorf("%d keys remembered, at most %d", len(l.keys), maxKeys)
	}
	if _, ok := l.keys[-1]; !ok {
		t.Error("a key with a request in flight was forgotten")
	}
	busy()
}

func TestClientAddr(t *testing.T) {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "[::1]:4000"
	if got := ClientAddr(r); got != "::1" {
		t.Errorf("ClientAddr %q", got)
	}
	r.RemoteAddr = "pipe"
	if got := ClientAddr(r); got != "pipe" {
		t.Errorf("ClientAddr %q", got)
	}
	w := httptest.NewRecorder()
	SetRetryAfter(w, 1500*time.Millisecond)
	if got := w.Header().Get("Retry-After"); got != "2" {
		t.Errorf("Retry-After %q, want 2", got)
	}
}
