package tokenguard_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/internal/sandbox"
)

// While the token endpoint is unreachable (here: a real closed port), a
// token that is due but still valid keeps being served, and after the
// first failures the calls stop trying to connect for a while: 40 calls
// make a handful of connection attempts, not one retry loop each.
func TestUnreachableTokenEndpointIsPaused(t *testing.T) {
	w := newWorld(t, sandbox.Options{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	_ = ln.Close()

	db := w.open(t, nil)
	importer := newTokens(t, w, db)
	ctx := context.Background()
	// The endpoint is never reached: the grant's times are the test's.
	grant := w.grant(t)
	before := time.Now()
	grant.Expiry = before.Add(8 * time.Second)
	if err := importer.Import(ctx, "acme", grant); err != nil {
		t.Fatal(err)
	}
	imported := time.Now()

	var dials atomic.Int64
	hc := provider.NewHTTPClient(5 * time.Second)
	tr := hc.Transport.(*http.Transport).Clone()
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return dial(ctx, network, addr)
	}
	hc.Transport = tr
	away := *w.oauth
	away.Endpoint = sandbox.Endpoint("http://" + closed)
	tg, err := tokenguard.New(db, &away, tokenguard.WithSkew(time.Minute), tokenguard.WithHTTPClient(hc))
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close(ctx)

	// Due (the skew is capped at half the 8 s lifetime), valid for ~4 s more.
	time.Sleep(time.Until(imported.Add(4*time.Second + 100*time.Millisecond)))
	served := 0
	for range 40 {
		tok, err := tg.Token(ctx, "acme")
		if err != nil {
			t.Fatalf("a still-valid token was not served: %v", err)
		}
		if tok.AccessToken != "" {
			served++
		}
	}
	if served != 40 || dials.Load() == 0 {
		t.Fatalf("%d of 40 calls served, %d connection attempts", served, dials.Load())
	}
	if n := dials.Load(); n > 2*provider.DefaultPauseAfter {
		t.Errorf("40 calls made %d connection attempts to the unreachable endpoint, want a few (paused)", n)
	}

	// Expired: the calls fail, as the provider being unavailable.
	time.Sleep(time.Until(grant.Expiry.Add(100 * time.Millisecond)))
	dialed := dials.Load()
	for range 20 {
		if _, err := tg.Token(ctx, "acme"); !errors.Is(err, tokenguard.ErrProviderUnavailable) {
			t.Fatalf("expired token, endpoint unreachable: err = %v, want ErrProviderUnavailable", err)
		}
	}
	if n := dials.Load() - dialed; n > 2*provider.DefaultPauseAfter {
		t.Errorf("20 calls made %d connection attempts to the unreachable endpoint, want a few (paused)", n)
	}
	if st := w.provider.Stats(); st.Refreshes != 0 {
		t.Errorf("the sandbox saw %d refreshes", st.Refreshes)
	}
}
