package demo

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/tokenguard/tokenguard/internal/sandbox"
)

// Sandbox is a sandbox provider served over HTTP.
type Sandbox struct {
	*sandbox.Provider
	URL string
	srv *http.Server
}

// StartSandbox serves a new sandbox provider on addr ("127.0.0.1:0" picks
// a free port). Redirect URIs default to any.
func StartSandbox(addr string, opts sandbox.Options) (*Sandbox, error) {
	if len(opts.RedirectURIs) == 0 {
		opts.RedirectURIs = []string{"*"}
	}
	p, err := sandbox.New(opts)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("sandbox: listen: %w", err)
	}
	srv := &http.Server{Handler: p.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }() // returns ErrServerClosed at Close
	return &Sandbox{Provider: p, URL: "http://" + ln.Addr().String(), srv: srv}, nil
}

// Close stops serving, letting requests in flight finish for up to 5s.
func (s *Sandbox) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		_ = s.srv.Close()
	}
}
