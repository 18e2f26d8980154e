//go:build !unix

package postgres

import "net"

// quiet cannot look at a socket here: every idle connection is pinged.
func quiet(net.Conn) bool { return false }
