package di

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/tokenguard/tokenguard/infra/provider"
)

// userAgent names the app at the token endpoint: which process refreshed.
type userAgent struct {
	base  http.RoundTripper
	value string
}

func (u userAgent) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context()) // a RoundTripper must not change the caller's request
	r.Header.Set("User-Agent", u.value)
	return u.base.RoundTrip(r)
}

// agentClient is a token endpoint client with app's User-Agent, if any.
func agentClient(timeout time.Duration, app string) *http.Client {
	c := provider.NewHTTPClient(timeout)
	if app != "" {
		c.Transport = userAgent{base: c.Transport, value: UserAgent(app)}
	}
	return c
}

// serveMetrics serves m at GET /metrics on addr until stop; a taken address fails the start.
func serveMetrics(addr string, m http.Handler, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on METRICS_ADDR: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m)
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		WriteTimeout:      30 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.Warn("metrics server stopped", "err", err)
		}
	}()
	log.Info("metrics listening", "addr", ln.Addr().String())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if srv.Shutdown(ctx) != nil {
			_ = srv.Close()
		}
		<-done
	}, nil
}
