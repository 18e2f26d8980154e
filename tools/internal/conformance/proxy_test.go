package conformance

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// upstream is a token endpoint that accepts one client secret, in either
// place, and counts what reached it.
func upstream(t *testing.T, reached *atomic.Int64) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		_ = r.ParseForm()
		_, secret, ok := r.BasicAuth()
		if !ok {
			secret = r.PostForm.Get("client_secret")
		}
		w.Header().Set("Content-Type", "application/json")
		if secret != "s3cret" {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":"invalid_client"}`))
			return
		}
		if r.PostForm.Get("refresh_token") == "spent" {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":"invalid_grant"}`))
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"access_token": "a", "token_type": "Bearer", "expires_in": 2})
	}))
	t.Cleanup(srv.Close)
	return srv
}

// clientID needs form-encoding in a Basic header (RFC 6749 §2.3.1).
const clientID = "client 1"

func post(t *testing.T, u string, basic bool, rt string) int {
	t.Helper()
	form := url.Values{"grant_type": {"refresh_token"}, "refresh_token": {rt}}
	if !basic {
		form.Set("client_id", clientID)
		form.Set("client_secret", "s3cret")
	}
	req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if basic {
		req.SetBasicAuth(url.QueryEscape(clientID), "s3cret")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func TestProxyModesAndCounts(t *testing.T) {
	var reached atomic.Int64
	p := NewProxy(upstream(t, &reached).URL)
	front := httptest.NewServer(p)
	t.Cleanup(front.Close)

	for _, basic := range []bool{true, false} {
		if got := post(t, front.URL, basic, "rt"); got != http.StatusOK {
			t.Errorf("pass (basic %v): %d", basic, got)
		}
	}
	if got := post(t, front.URL, true, "spent"); got != http.StatusBadRequest {
		t.Errorf("spent token: %d", got)
	}
	mark := p.Mark()
	p.SetMode(RejectClient)
	for _, basic := range []bool{true, false} {
		if got := post(t, front.URL, basic, "rt"); got != http.StatusUnauthorized {
			t.Errorf("reject client (basic %v): %d, want 401 from the server", basic, got)
		}
	}
	p.SetMode(Unavailable)
	before := reached.Load()
	if got := post(t, front.URL, true, "rt"); got != http.StatusServiceUnavailable {
		t.Errorf("unavailable: %d", got)
	}
	if reached.Load() != before {
		t.Error("an Unavailable request reached the server")
	}
	p.SetMode(Pass)

	all := Count(p.Answers(0))
	want := Counts{Requests: 6, Refreshed: 2, InvalidGrant: 1, InvalidClient: 2, Injected: 1}
	if all != want {
		t.Errorf("counts %+v, want %+v", all, want)
	}
	if got := p.Since(mark); got.InvalidClient != 2 || got.Requests != 3 {
		t.Errorf("since mark: %+v", got)
	}
	auth := map[string]int{}
	for _, a := range p.Answers(0) {
		auth[a.Auth]++
		if want := map[bool]time.Duration{true: 2 * time.Second}[a.Status == http.StatusOK]; a.ExpiresIn != want || a.At.IsZero() {
			t.Errorf("%s answer %d: expires_in %v at %v, want %v and a time", a.Auth, a.Status, a.ExpiresIn, a.At, want)
		}
		if a.ClientID != clientID {
			t.Errorf("%s request: client id %q, want %q", a.Auth, a.ClientID, clientID)
		}
	}
	if auth["basic"] != 4 || auth["post"] != 2 {
		t.Errorf("auth methods seen: %v", auth)
	}
}
