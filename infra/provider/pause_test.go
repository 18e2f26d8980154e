package provider_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/internal/sandbox"
)

// closedPort is an address nothing listens on: connecting is refused.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// countingClient is an HTTP client for the token endpoint that counts its
// connection attempts.
func countingClient(dials *atomic.Int64) *http.Client {
	c := provider.NewHTTPClient(5 * time.Second)
	tr := c.Transport.(*http.Transport).Clone()
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return dial(ctx, network, addr)
	}
	c.Transport = tr
	return c
}

// Ten refreshes of ten connections at a token endpoint where nothing
// listens: the first finds it unreachable three times, then it is paused
// and the other nine fail at once without a connection attempt. The
// control, with the pause turned off, retries every call until its
// deadline.
func TestRetryingPausesAnUnreachableTokenEndpoint(t *testing.T) {
	addr := closedPort(t)
	cfg := &oauth2.Config{ClientID: "c", ClientSecret: "s", Endpoint: sandbox.Endpoint("http://" + addr)}
	calls := func(pauseAfter int) (dials int64, errs []error) {
		var n atomic.Int64
		ret := provider.NewRetrying(provider.NewRefresher(cfg, countingClient(&n)),
			provider.Policy{InitialInterval: 5 * time.Millisecond, MaxInterval: 20 * time.Millisecond, PauseAfter: pauseAfter})
		for range 10 {
			ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
			_, err := ret.Refresh(ctx, domain.NewSecret("rt"))
			cancel()
			errs = append(errs, err)
		}
		return n.Load(), errs
	}

	dials, errs := calls(0)
	for _, err := range errs {
		if !errors.Is(err, domain.ErrProviderUnavailable) {
			t.Fatalf("err = %v, want ErrProviderUnavailable", err)
		}
	}
	if dials != provider.DefaultPauseAfter {
		t.Errorf("%d connection attempts for 10 refreshes, want %d (then paused)", dials, provider.DefaultPauseAfter)
	}
	if last := errs[len(errs)-1].Error(); !strings.Contains(last, "not called") || !strings.Contains(last, "connection refused") {
		t.Errorf("a paused call's error = %q, want it to say the endpoint was not called, and why", last)
	}

	control, _ := calls(-1)
	if control < 10*provider.DefaultPauseAfter {
		t.Errorf("control without the pause: %d connection attempts for 10 refreshes, want each retried", control)
	}
}

// The pause ends by itself: once something listens on the endpoint again,
// a refresh after the pause goes through, and an answer resets the pause.
func TestRetryingCallsAgainAfterThePause(t *testing.T) {
	r := newRig(t)
	addr := closedPort(t)
	cfg := *r.oauth
	cfg.Endpoint = sandbox.Endpoint("http://" + addr)
	var dials atomic.Int64
	ret := provider.NewRetrying(provider.NewRefresher(&cfg, countingClient(&dials)),
		provider.Policy{InitialInterval: 5 * time.Millisecond, MaxInterval: 20 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := ret.Refresh(ctx, domain.NewSecret(r.first.RefreshToken)); !errors.Is(err, domain.ErrProviderUnavailable) {
		t.Fatalf("err = %v, want ErrProviderUnavailable", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("the port was taken meanwhile: %v", err)
	}
	srv := &http.Server{Handler: r.srv.Config.Handler}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	for {
		_, err := ret.Refresh(ctx, domain.NewSecret(r.first.RefreshToken))
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "not called") {
			t.Fatalf("err = %v, want success or a paused call", err)
		}
		select {
		case <-ctx.Done():
			t.Fatal("the pause never ended")
		case <-time.After(20 * time.Millisecond):
		}
	}
	if st := r.p.Stats(); st.Refreshes != 1 || st.RefreshReuse != 0 {
		t.Errorf("provider: %d refreshes, %d reuses; want 1 and 0", st.Refreshes, st.RefreshReuse)
	}
}
