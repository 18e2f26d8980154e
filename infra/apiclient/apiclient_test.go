package apiclient

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// tokens is a fake of the refresh use case: it hands out version 1 ("old")
// until ForceRefresh moves it to version 2 ("new"), as a refresh elsewhere
// would. Unit tests of the transport's logic only; transport_integration_test.go
// runs it against the real use case and provider.
type tokens struct {
	mu     sync.Mutex
	cur    domain.Token
	forced []int64
	err    error
	stuck  bool // ForceRefresh cannot produce a newer token
}

func newTokens() *tokens {
	return &tokens{cur: domain.Token{Connection: "acme", AccessToken: domain.NewSecret("old"), Version: 1}}
}

func (f *tokens) Token(context.Context, string) (domain.Token, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cur, f.err
}

func (f *tokens) ForceRefresh(_ context.Context, _ string, failed int64) (domain.Token, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.forced = append(f.forced, failed)
	if f.stuck {
		return domain.Token{}, domain.ErrRefreshRateLimited
	}
	if f.cur.Version == failed {
		f.cur = domain.Token{Connection: "acme", AccessToken: domain.NewSecret("new"), Version: failed + 1}
	}
	return f.cur, nil
}

// api accepts only "Bearer new", as a provider that revoked "old" would,
// and records what it was sent.
func api(t *testing.T, challenge string) (*httptest.Server, *[]string) {
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, strings.TrimSpace(r.Header.Get("Authorization")+" "+r.UserAgent()+" "+string(body)))
		mu.Unlock()
		if r.URL.Path != "/v1/resource" {
			http.NotFound(w, r)
			return
		}
		if r.Header.Get("Authorization") != "Bearer new" {
			if challenge != "" {
				w.Header().Set("WWW-Authenticate", challenge)
			}
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	t.Cleanup(srv.Close)
	return srv, &seen
}

func TestRevokedTokenIsRetriedOnceWithANewerOne(t *testing.T) {
	for _, challenge := range []string{`Bearer error="invalid_token"`, "", `Bearer realm="x"`} {
		srv, seen := api(t, challenge)
		tk := newTokens()
		c, err := New(srv.URL+"/v1", TokenClients(tk), Options{UserAgent: "tokenguard-test/1.0"})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Get(context.Background(), "acme", "/resource")
		if err != nil || resp.StatusCode != http.StatusOK || string(resp.Body) != `{"ok":true}` {
			t.Fatalf("%q: Get = %+v, %v", challenge, resp, err)
		}
		want := []string{"Bearer old tokenguard-test/1.0", "Bearer new tokenguard-test/1.0"}
		if len(*seen) != 2 || (*seen)[0] != want[0] || (*seen)[1] != want[1] {
			t.Errorf("%q: requests = %q, want %q", challenge, *seen, want)
		}
		if len(tk.forced) != 1 || tk.forced[0] != 1 {
			t.Errorf("%q: forced refreshes %v, want one for version 1", challenge, tk.forced)
		}
	}
}

func TestOtherUnauthorizedAnswersAreNotRetried(t *testing.T) {
	srv, seen := api(t, `Bearer error="insufficient_scope"`)
	tk := newTokens()
	c, _ := New(srv.URL+"/v1", TokenClients(tk), Options{})
	resp, err := c.Get(context.Background(), "acme", "/resource")
	if err != nil || resp.StatusCode != http.StatusUnauthorized || len(*seen) != 1 || len(tk.forced) != 0 {
		t.Errorf("insufficient_scope: %+v %v, %d requests, forced %v", resp, err, len(*seen), tk.forced)
	}
}

func TestPersistent401ReachesTheCaller(t *testing.T) {
	srv, seen := api(t, "")
	tk := newTokens()
	tk.stuck = true
	c, _ := New(srv.URL+"/v1", TokenClients(tk), Options{})
	resp, err := c.Get(context.Background(), "acme", "/resource")
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("Get = %+v, %v; want the 401", resp, err)
	}
	if len(*seen) != 1 {
		t.Errorf("sent %d requests, want 1 (no newer token to retry with)", len(*seen))
	}
	err = c.Call(context.Background(), "acme", "/resource")
	var se *StatusError
	if !errors.As(err, &se) || se.StatusCode != http.StatusUnauthorized {
		t.Errorf("Call = %v, want a StatusError 401", err)
	}
}

func TestBodiesAreReplayedOnlyWhenPossible(t *testing.T) {
	srv, seen := api(t, "")
	tk := newTokens()
	c, _ := New(srv.URL+"/v1", TokenClients(tk), Options{})
	hc := c.HTTPClient(context.Background(), "acme")

	// bytes.Reader: net/http sets GetBody, so the retry resends the body.
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/resource", bytes.NewReader([]byte("payload")))
	resp, err := hc.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("replayable POST: %v %v", resp, err)
	}
	resp.Body.Close()
	if (*seen)[1] != "Bearer new Go-http-client/1.1 payload" {
		t.Errorf("retry sent %q", (*seen)[1])
	}

	// A one-shot stream cannot be sent twice: the 401 is returned.
	tk2 := newTokens()
	c2, _ := New(srv.URL+"/v1", TokenClients(tk2), Options{})
	req, _ = http.NewRequest(http.MethodPost, srv.URL+"/v1/resource", io.NopCloser(strings.NewReader("stream")))
	resp, err = c2.HTTPClient(context.Background(), "acme").Do(req)
	if err != nil || resp.StatusCode != http.StatusUnauthorized || len(tk2.forced) != 0 {
		t.Errorf("one-shot body: %v %v, forced %v", resp, err, tk2.forced)
	}
	resp.Body.Close()
}

func TestTokenErrorsAndUnreachableAPI(t *testing.T) {
	srv, _ := api(t, "")
	tk := newTokens()
	tk.err = domain.ErrNeedsReauth
	c, _ := New(srv.URL+"/v1", TokenClients(tk), Options{})
	if _, err := c.Get(context.Background(), "acme", "/resource"); !errors.Is(err, domain.ErrNeedsReauth) {
		t.Errorf("err = %v, want ErrNeedsReauth", err)
	}
	srv.Close()
	c, _ = New(srv.URL, TokenClients(newTokens()), Options{Timeout: time.Second})
	_, err := c.Get(context.Background(), "acme", "/resource")
	if !errors.Is(err, ErrUnavailable) {
		t.Errorf("err = %v, want ErrUnavailable", err)
	}
	if _, err := New("not a url", TokenClients(newTokens()), Options{}); err == nil {
		t.Error("accepted a base URL without scheme")
	}
}

// bases sends "globex" to its own API.
type bases map[string]string

func (b bases) BaseURL(_ context.Context, connection string) (string, error) {
	return b[connection], nil
}

func TestCallsGoToTheConnectionsProviderAPI(t *testing.T) {
	main, mainSeen := api(t, "")
	other, otherSeen := api(t, "")
	tk := newTokens()
	tk.cur.AccessToken = domain.NewSecret("new")
	c, err := New(main.URL+"/v1", TokenClients(tk), Options{Bases: bases{"globex": other.URL + "/v1"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, connection := range []string{"acme", "globex"} {
		if resp, err := c.Get(context.Background(), connection, "/resource"); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %v %v", connection, resp, err)
		}
	}
	if len(*mainSeen) != 1 || len(*otherSeen) != 1 {
		t.Errorf("calls: %d to API_BASE_URL, %d to the provider's API; want 1 and 1", len(*mainSeen), len(*otherSeen))
	}
	bad, _ := New(main.URL, TokenClients(tk), Options{Bases: bases{"globex": "ftp://x"}})
	if _, err := bad.Get(context.Background(), "globex", "/resource"); err == nil {
		t.Error("called a provider API base URL that is not http(s)")
	}
}

// TestAnswerOverTheLimitIsAnError: a body longer than maxBody is
// ErrTooLarge, never a truncated body; one of exactly maxBody (the
// control) is returned whole.
func TestAnswerOverTheLimitIsAnError(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
		_, _ = w.Write(bytes.Repeat([]byte("x"), n))
	}))
	defer srv.Close()
	c, err := New(srv.URL, TokenClients(newTokens()), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := c.Get(context.Background(), "acme", "/"+strconv.Itoa(maxBody)); err != nil || len(resp.Body) != maxBody {
		t.Fatalf("control, exactly the limit: %v", err)
	}
	if resp, err := c.Get(context.Background(), "acme", "/"+strconv.Itoa(maxBody+1)); !errors.Is(err, ErrTooLarge) || resp != nil {
		t.Errorf("one byte over the limit: %v, %v", resp, err)
	}
}
