package testworld

import (
	"sync/atomic"
	"time"
)

// Clock is a clock the stacks of a test share (usecase.Options.Clock),
// offset from the real one: a test moves it ahead instead of sleeping
// until the stacks find a token due or expired. The provider still issues
// tokens by the real clock.
type Clock struct{ offset atomic.Int64 }

func (c *Clock) Now() time.Time { return time.Now().Add(time.Duration(c.offset.Load())) }

// MoveTo moves the clock so that it reads t now.
func (c *Clock) MoveTo(t time.Time) { c.offset.Store(int64(time.Until(t))) }

// Advance moves the clock d ahead.
func (c *Clock) Advance(d time.Duration) { c.offset.Add(int64(d)) }
