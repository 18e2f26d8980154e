package postgres

import (
	"context"
	"crypto/tls"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
)

// shouldPing pings an idle connection before reuse only if its socket holds something (a server
// that drops a connection leaves its last error and the end of the stream there), has ended, or
// cannot be looked at: a refresh's first statement then costs one round trip, not two.
func shouldPing(_ context.Context, p stdlib.ShouldPingParams) bool {
	if p.IdleDuration <= time.Second {
		return false // pgx's own rule: recently used, taken as alive
	}
	c := p.Conn.PgConn().Conn()
	if t, ok := c.(*tls.Conn); ok {
		c = t.NetConn() // a close_notify or an error is a record in the socket too
	}
	return !quiet(c)
}
