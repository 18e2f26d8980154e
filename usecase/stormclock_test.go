package usecase_test

import (
	"sync/atomic"
	"time"
)

// stormClock is a clock the stacks of a test share, offset from the real
// one: moved ahead, it finds every stored token expired (the benchmarks'
// storm clock, tools/bench).
type stormClock struct{ offset atomic.Int64 }

func (c *stormClock) Now() time.Time { return time.Now().Add(time.Duration(c.offset.Load())) }
