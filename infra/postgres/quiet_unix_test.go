//go:build unix

package postgres

import (
	"net"
	"testing"
	"time"
)

// quiet tells an open, silent socket from one with something to read or
// one that ended, and answers at once while another goroutine is blocked
// reading the same connection (as pgx's background reader can be on an
// idle pooled connection).
func TestQuiet(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pair := func() (client, server net.Conn) {
		accepted := make(chan net.Conn, 1)
		go func() { c, _ := ln.Accept(); accepted <- c }()
		client, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		server = <-accepted
		t.Cleanup(func() { _ = client.Close(); _ = server.Close() })
		return client, server
	}
	eventually := func(what string, want bool, c net.Conn) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); quiet(c) != want; {
			if time.Now().After(deadline) {
				t.Fatalf("%s: quiet is %v", what, !want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	c, s := pair()
	if !quiet(c) {
		t.Fatal("an open, silent connection is not quiet")
	}
	if _, err := s.Write([]byte{'E'}); err != nil {
		t.Fatal(err)
	}
	eventually("a byte waits to be read", false, c)
	var b [1]byte
	if _, err := c.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	eventually("the byte was read", true, c)
	_ = s.Close()
	eventually("the peer closed", false, c)

	// A reader blocked on the connection does not block quiet.
	c, s = pair()
	go func() { _, _ = c.Read(b[:]) }()
	time.Sleep(20 * time.Millisecond) // the reader is parked
	answered := make(chan bool, 1)
	go func() { answered <- quiet(c) }()
	select {
	case q := <-answered:
		if !q {
			t.Error("an open, silent connection with a blocked reader is not quiet")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("quiet waited for the connection's blocked reader")
	}
	_ = s.Close()
}
