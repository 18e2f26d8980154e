package usecase_test

import (
	"context"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/internal/testworld"
	"github.com/tokenguard/tokenguard/internal/waitfor"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// blackhole is a TCP proxy that can stop delivering without closing
// anything, like a half-open connection or a pooler that swallowed a
// LISTEN: bytes are read and dropped. A connection that lost bytes stays
// mute for good (its protocol stream is broken); new ones work once the
// proxy is healed.
type blackhole struct {
	ln   net.Listener
	on   atomic.Bool
	mu   sync.Mutex
	open []net.Conn
}

func newBlackhole(t *testing.T, target string) *blackhole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			b.mu.Lock()
			b.open = append(b.open, c, up)
			b.mu.Unlock()
			var mute atomic.Bool
			go b.pipe(up, c, &mute)
			go b.pipe(c, up, &mute)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, c := range b.open {
			_ = c.Close()
		}
	})
	return b
}

func (b *blackhole) pipe(dst, src net.Conn, mute *atomic.Bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if b.on.Load() {
				mute.Store(true)
			}
			if !mute.Load() {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			if err == io.EOF && !mute.Load() {
				_ = dst.(*net.TCPConn).CloseWrite()
			}
			return
		}
	}
}

// via returns dbURL reaching its server through the proxy.
func (b *blackhole) via(t *testing.T, dbURL string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = b.ln.Addr().String()
	q := u.Query()
	q.Set("connect_timeout", "1")
	u.RawQuery = q.Encode()
	return u.String()
}

// A listener whose traffic silently stops must stop vouching for the
// cache: with a heartbeat, a change committed meanwhile by another process
// is served within a few heartbeats, and the cache comes back when the
// traffic does. Without one (the control), the superseded token is served
// for as long as it looks fresh.
func TestListenerHeartbeatWithdrawsTrustWhenTrafficIsBlackholed(t *testing.T) {
	for _, tc := range []struct {
		name      string
		heartbeat bool
	}{{"heartbeat", true}, {"no heartbeat (control)", false}} {
		t.Run(tc.name, func(t *testing.T) {
			w := testworld.New(t, time.Hour)
			target, err := url.Parse(w.URL)
			if err != nil {
				t.Fatal(err)
			}
			proxy := newBlackhole(t, target.Host)
			a := w.Stack(t, usecase.Options{})
			queries := testworld.CountQueries(t, a.DB)
			l := repository.NewChangeListener(proxy.via(t, w.URL), a.UC, nil)
			if tc.heartbeat {
				l = l.WithHeartbeat(a.DB, 100*time.Millisecond)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); _ = l.Run(ctx) }()
			t.Cleanup(func() { cancel(); <-done })

			b := w.Stack(t, usecase.Options{})
			v1 := w.Connect(t, a)
			a.WaitCached(t, queries)

			proxy.on.Store(true)
			v2 := w.Connect(t, b) // its NOTIFY never reaches a's listener
			served := func() int64 {
				tok, err := a.UC.Token(context.Background(), conn)
				if err != nil {
					t.Fatal(err)
				}
				return tok.Version
			}
			if !tc.heartbeat {
				time.Sleep(1500 * time.Millisecond) // 15 heartbeats' worth
				if got := served(); got != v1.Version {
					t.Fatalf("control served version %d; expected the superseded %d (is the proxy muting?)", got, v1.Version)
				}
				return
			}
			waitfor.Until(t, 5*time.Second, "superseded token still served with the feed blackholed", func() bool { return served() == v2.Version })

			proxy.on.Store(false)
			a.WaitCached(t, queries)
			if got := served(); got != v2.Version {
				t.Errorf("after the feed came back served version %d, want %d", got, v2.Version)
			}
		})
	}
}
