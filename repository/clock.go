package repository

import (
	"context"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/usecase"
)

// DatabaseClock tells the database server's time on this host: its clock corrected by the
// measured offset, so that processes agree on "stale" however far their own clocks drift.
type DatabaseClock struct {
	db     *gorm.DB
	local  func() time.Time
	offset atomic.Int64 // server minus host, nanoseconds
}

// NewDatabaseClock measures the offset of local (nil: time.Now) from db's server.
func NewDatabaseClock(ctx context.Context, db *gorm.DB, local func() time.Time) (*DatabaseClock, error) {
	if local == nil {
		local = time.Now
	}
	c := &DatabaseClock{db: db, local: local}
	if err := c.Measure(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// Now is the server's time, as well as this host can tell it.
func (c *DatabaseClock) Now() time.Time {
	return c.local().Add(time.Duration(c.offset.Load()))
}

// Offset is the server's clock minus this host's.
func (c *DatabaseClock) Offset() time.Duration { return time.Duration(c.offset.Load()) }

// Measure keeps the offset seen with the shortest of a few round trips.
func (c *DatabaseClock) Measure(ctx context.Context) error {
	best := time.Duration(-1)
	var offset time.Duration
	for range 3 {
		sent := c.local()
		server, err := scan[time.Time](ctx, c.db, "read the database clock", "SELECT clock_timestamp()")
		if err != nil {
			return err
		}
		rtt := c.local().Sub(sent)
		if best < 0 || rtt < best {
			best, offset = rtt, server.Sub(sent.Add(rtt/2))
		}
	}
	c.offset.Store(int64(offset))
	return nil
}

// Run measures again every interval until ctx ends; failures keep the last offset.
func (c *DatabaseClock) Run(ctx context.Context, interval time.Duration) {
	usecase.Every(ctx, interval, func() { _ = c.Measure(ctx) })
}
