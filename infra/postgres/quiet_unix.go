//go:build unix

package postgres

import (
	"errors"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// quiet reports whether c is open with nothing to read: a non-blocking peek at its socket, through
// RawConn.Control, not Read: pgx's background reader may be blocked on it, holding the read lock.
func quiet(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var peekErr error
	var b [1]byte
	if err := rc.Control(func(fd uintptr) {
		_, _, peekErr = unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
	}); err != nil {
		return false
	}
	// EAGAIN: open, nothing sent. Otherwise a message (n > 0), the end (n == 0) or an error.
	return errors.Is(peekErr, unix.EAGAIN) || errors.Is(peekErr, unix.EWOULDBLOCK)
}
