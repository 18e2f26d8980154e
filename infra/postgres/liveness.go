package postgres

import (
	"context"
	"crypto/tls"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
)

// shouldPing decides whether the pool pings a connection before reusing
// it. pgx pings one idle for over a second, a round trip, to discard a
// connection the server dropped. But a server that drops a connection
// says so: its last error and the end of the stream wait in the socket. So
// an idle connection is pinged only if its socket holds something, has
// ended, or cannot be looked at, and a refresh's first statement costs one
// round trip instead of two. A peer gone without a word fails the ping and
// the statement alike, by the caller's deadline.
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
