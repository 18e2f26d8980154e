package provider

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
)

var (
	granted       = reply{200, "", nil, `{"access_token":"at","refresh_token":"rt2","expires_in":60}`}
	clientRefused = reply{401, "", http.Header{"WWW-Authenticate": {`Basic realm="token"`}}, `{"error":"invalid_client"}`}
)

// only accepts the client in one style and refuses it in any other, as
// strict servers do: with 401 invalid_client, or with what refused says.
func only(style string, refused reply) func(seen) reply {
	return func(s seen) reply {
		if s.style != style {
			return refused
		}
		return granted
	}
}

func styles(got []seen) []string {
	out := make([]string, len(got))
	for i, s := range got {
		out[i] = s.style
		if s.refreshToken != testRefreshToken {
			out[i] += "(wrong refresh token)"
		}
	}
	return out
}

func refresh(t *testing.T, r *Refresher) error {
	t.Helper()
	_, err := r.Refresh(context.Background(), domain.NewSecret(testRefreshToken))
	return err
}

// The default, auto, works against a server that takes only HTTP Basic
// and against one that takes only the form body, presenting the refresh
// token at most twice, and twice only after a client authentication
// failure; later refreshes start with the style that worked. The fixed
// styles never probe.
func TestAutoStyle(t *testing.T) {
	cases := []struct {
		name   string
		server func(seen) reply
		style  oauth2.AuthStyle
		first  []string // requests of the first refresh
		second []string // of the second
		fails  bool
	}{
		{"auto, Basic-only server", only(StyleHeader, clientRefused), oauth2.AuthStyleAutoDetect,
			[]string{"header"}, []string{"header"}, false},
		{"auto, form-only server (401 invalid_client)", only(StyleParams, clientRefused), oauth2.AuthStyleAutoDetect,
			[]string{"header", "params"}, []string{"params"}, false},
		{"auto, form-only server (400 invalid_client)", only(StyleParams, reply{400, "", nil, `{"error":"invalid_client"}`}), oauth2.AuthStyleAutoDetect,
			[]string{"header", "params"}, []string{"params"}, false},
		{"auto, form-only server (bare 401)", only(StyleParams, reply{401, "", nil, ``}), oauth2.AuthStyleAutoDetect,
			[]string{"header", "params"}, []string{"params"}, false},
		{"auto, client refused in both styles", fixed(clientRefused), oauth2.AuthStyleAutoDetect,
			[]string{"header", "params"}, []string{"header", "params"}, true},
		{"header, form-only server", only(StyleParams, clientRefused), oauth2.AuthStyleInHeader,
			[]string{"header"}, []string{"header"}, true},
		{"params, Basic-only server", only(StyleHeader, clientRefused), oauth2.AuthStyleInParams,
			[]string{"params"}, []string{"params"}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEndpoint(t, c.server)
			r := NewRefresher(e.config(c.style), nil)
			err := refresh(t, r)
			if got := styles(e.requests()); fmt.Sprint(got) != fmt.Sprint(c.first) {
				t.Errorf("first refresh: requests %v, want %v", got, c.first)
			}
			if (err != nil) != c.fails || (err != nil && !errors.Is(err, domain.ErrClientRejected)) {
				t.Errorf("first refresh: err = %v", err)
			}
			n := len(e.requests())
			err = refresh(t, r)
			if got := styles(e.requests()[n:]); fmt.Sprint(got) != fmt.Sprint(c.second) {
				t.Errorf("second refresh: requests %v, want %v", got, c.second)
			}
			if (err != nil) != c.fails {
				t.Errorf("second refresh: err = %v", err)
			}
		})
	}
}

// hangUp reads a request and closes the connection without an answer: the
// provider may or may not have processed it.
func hangUp(t *testing.T, count *int, mu *sync.Mutex) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if _, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
				mu.Lock()
				*count++
				mu.Unlock()
			}
			c.Close()
		}
	}()
	return "http://" + ln.Addr().String() + "/token"
}

// After any failure but a client authentication failure the first request
// may have been processed: auto never sends the refresh token again, with
// nothing learned yet nor with a learned style. The control shows that
// x/oauth2's auto-detection, given the same answers, does.
func TestAutoNeverFallsBackAfterOtherFailures(t *testing.T) {
	slow := func(seen) reply { time.Sleep(400 * time.Millisecond); return granted }
	cases := []struct {
		name   string
		answer func(seen) reply
		want   error
	}{
		{"invalid_grant", fixed(reply{400, "", nil, `{"error":"invalid_grant"}`}), domain.ErrGrantRevoked},
		{"500", fixed(reply{500, "", nil, `{"error":"server_error"}`}), domain.ErrProviderUnavailable},
		{"503 HTML", fixed(reply{503, "text/html", nil, `<html>down</html>`}), domain.ErrProviderUnavailable},
		{"429", fixed(reply{429, "", nil, ``}), domain.ErrProviderUnavailable},
		{"timeout", slow, domain.ErrProviderUnavailable},
		{"unauthorized_client 400", fixed(reply{400, "", nil, `{"error":"unauthorized_client"}`}), domain.ErrClientRejected},
		{"invalid_request", fixed(reply{400, "", nil, `{"error":"invalid_request"}`}), domain.ErrProviderUnavailable},
		{"404", fixed(reply{404, "", nil, ``}), domain.ErrEndpointMisconfigured},
		{"200 without an access token", fixed(reply{200, "", nil, `{}`}), domain.ErrProviderUnavailable},
	}
	client := NewHTTPClient(200 * time.Millisecond)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, learned := range []oauth2.AuthStyle{0, oauth2.AuthStyleInHeader, oauth2.AuthStyleInParams} {
				e := newEndpoint(t, c.answer)
				r := NewRefresher(e.config(oauth2.AuthStyleAutoDetect), client)
				r.learned.Store(int32(learned))
				if err := refresh(t, r); !errors.Is(err, c.want) {
					t.Errorf("learned %v: err = %v, want %v", learned, err, c.want)
				}
				if got := e.requests(); len(got) != 1 {
					t.Errorf("learned %v: the refresh token went %d times (%v), want once", learned, len(got), styles(got))
				}
			}
		})
	}
	t.Run("connection lost after the request", func(t *testing.T) {
		var mu sync.Mutex
		n := 0
		cfg := &oauth2.Config{ClientID: testClientID, ClientSecret: testClientSecret, Endpoint: oauth2.Endpoint{TokenURL: hangUp(t, &n, &mu)}}
		if err := refresh(t, NewRefresher(cfg, client)); !errors.Is(err, domain.ErrProviderUnavailable) {
			t.Errorf("err = %v", err)
		}
		mu.Lock()
		defer mu.Unlock()
		if n != 1 {
			t.Errorf("the refresh token went %d times, want once", n)
		}
	})
	t.Run("control: x/oauth2 auto-detection sends it twice", func(t *testing.T) {
		e := newEndpoint(t, fixed(reply{400, "", nil, `{"error":"invalid_grant"}`}))
		ctx := context.WithValue(context.Background(), oauth2.HTTPClient, client)
		_, err := e.config(oauth2.AuthStyleAutoDetect).TokenSource(ctx, &oauth2.Token{RefreshToken: testRefreshToken}).Token()
		if err == nil {
			t.Fatal("refresh succeeded")
		}
		if got := e.requests(); len(got) != 2 {
			t.Errorf("x/oauth2 sent the refresh token %d times (%v); the control no longer shows the double presentation", len(got), styles(got))
		}
	})
}

// The remembered style is tried first; when the provider stops taking it
// (its client registration changed), the other style is tried once and
// becomes the remembered one.
func TestAutoRelearns(t *testing.T) {
	var mu sync.Mutex
	accept := StyleParams
	e := newEndpoint(t, func(s seen) reply {
		mu.Lock()
		defer mu.Unlock()
		return only(accept, clientRefused)(s)
	})
	store := &memStore{}
	r := NewRefresher(e.config(oauth2.AuthStyleAutoDetect), nil, WithAuthStyleStore(store))
	if err := refresh(t, r); err != nil {
		t.Fatal(err)
	}
	store.wait(t, StyleParams)
	mu.Lock()
	accept = StyleHeader
	mu.Unlock()
	n := len(e.requests())
	if err := refresh(t, r); err != nil {
		t.Fatal(err)
	}
	if got := styles(e.requests()[n:]); fmt.Sprint(got) != "[params header]" {
		t.Errorf("requests %v, want [params header]", got)
	}
	store.wait(t, StyleHeader)
	n = len(e.requests())
	if err := refresh(t, r); err != nil {
		t.Fatal(err)
	}
	if got := styles(e.requests()[n:]); fmt.Sprint(got) != "[header]" {
		t.Errorf("requests %v, want [header]", got)
	}
}

// memStore is an AuthStyleStore in memory, for the logic around it (the
// Postgres one is tested in styles_integration_test.go).
type memStore struct {
	mu      sync.Mutex
	style   string
	loadErr error
	loads   int
	saves   int
}

func (m *memStore) Load(_ context.Context, tokenURL, clientID string) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.loads++
	return m.style, m.loadErr
}

func (m *memStore) Save(_ context.Context, tokenURL, clientID, style string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.saves++
	m.style = style
	return nil
}

func (m *memStore) wait(t *testing.T, style string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		m.mu.Lock()
		s := m.style
		m.mu.Unlock()
		if s == style {
			return
		}
	}
	t.Fatalf("store never held %q", style)
}

func TestAutoStartsWithTheStoredStyle(t *testing.T) {
	e := newEndpoint(t, only(StyleParams, clientRefused))
	store := &memStore{style: StyleParams}
	r := NewRefresher(e.config(oauth2.AuthStyleAutoDetect), nil, WithAuthStyleStore(store))
	for range 3 {
		if err := refresh(t, r); err != nil {
			t.Fatal(err)
		}
	}
	if got := styles(e.requests()); fmt.Sprint(got) != "[params params params]" {
		t.Errorf("requests %v", got)
	}
	time.Sleep(50 * time.Millisecond) // a save would have been started by now
	store.mu.Lock()
	defer store.mu.Unlock()
	if store.loads != 1 || store.saves != 0 {
		t.Errorf("%d loads, %d saves; want 1, 0", store.loads, store.saves)
	}
}

// A store that cannot be read costs at most the probe, and the style
// learned is still remembered in memory and stored.
func TestAutoSurvivesAFailingStore(t *testing.T) {
	e := newEndpoint(t, only(StyleParams, clientRefused))
	store := &memStore{loadErr: errors.New("database down")}
	var buf strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	}), nil))
	r := NewRefresher(e.config(oauth2.AuthStyleAutoDetect), nil, WithAuthStyleStore(store), WithLogger(log))
	if err := refresh(t, r); err != nil {
		t.Fatal(err)
	}
	store.wait(t, StyleParams)
	if err := refresh(t, r); err != nil {
		t.Fatal(err)
	}
	if got := styles(e.requests()); fmt.Sprint(got) != "[header params params]" {
		t.Errorf("requests %v", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(buf.String(), "auth_style=params") || !strings.Contains(buf.String(), "could not read") {
		t.Errorf("log: %s", buf.String())
	}
	checkClean(t, "log", buf.String())
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
