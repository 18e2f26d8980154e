package provider

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
)

// fuzzAnswer is what the token endpoint sends for one fuzz input.
type fuzzAnswer struct {
	status      int
	contentType string
	retryAfter  string
	body        []byte
}

// FuzzRefreshResponse feeds arbitrary token endpoint answers (status,
// content type, Retry-After and body) to Refresher.Refresh. It must never
// panic, must return either a grant with an access token or an error, and
// errors must be classified and must not carry the refresh token.
// Seeds: testdata/fuzz/FuzzRefreshResponse and the f.Add calls below.
func FuzzRefreshResponse(f *testing.F) {
	f.Add(200, false, "", []byte(`{"access_token":"at","token_type":"bearer","refresh_token":"rt2","expires_in":60}`))
	f.Add(200, false, "", []byte(`{"access_token":"at","expires_in":"60"}`))
	f.Add(200, false, "", []byte(`{"access_token":"","refresh_token":"rt2"}`))
	f.Add(200, false, "", []byte(`{"access_token":123}`))
	f.Add(200, false, "", []byte(`{"access_token":"at","expires_in":-1e309}`))
	f.Add(200, true, "", []byte(`access_token=at&token_type=bearer&expires_in=60&refresh_token=rt2`))
	f.Add(200, true, "", []byte(`access_token=&expires_in=abc`))
	f.Add(200, false, "", []byte(``))
	f.Add(200, false, "", []byte(`null`))
	f.Add(400, false, "", []byte(`{"error":"invalid_grant","error_description":"rt-fuzz-marker reused"}`))
	f.Add(401, false, "", []byte(`{"error":["invalid_client"]}`))
	f.Add(429, false, "7", []byte(`{"error":"temporarily_unavailable"}`))
	f.Add(429, false, "Wed, 21 Oct 2099 07:28:00 GMT", []byte(`{}`))
	f.Add(503, false, "-5", []byte(`<html>down</html>`))
	f.Add(302, false, "", []byte(`moved`))
	f.Add(200, false, "", []byte("\xff\xfe{\"access_token\":\"at\"}"))

	var (
		mu      sync.Mutex
		answers = map[string]fuzzAnswer{}
		seq     atomic.Int64
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		a := answers[r.URL.Path]
		mu.Unlock()
		w.Header().Set("Content-Type", a.contentType)
		if a.retryAfter != "" {
			w.Header().Set("Retry-After", a.retryAfter)
		}
		w.WriteHeader(a.status)
		_, _ = w.Write(a.body)
	}))
	f.Cleanup(srv.Close)
	client := NewHTTPClient(5 * time.Second)

	const marker = "rt-fuzz-marker"
	f.Fuzz(func(t *testing.T, status int, form bool, retryAfter string, body []byte) {
		a := fuzzAnswer{status: 200 + abs(status)%400, contentType: "application/json", retryAfter: retryAfter, body: body}
		if form {
			a.contentType = "application/x-www-form-urlencoded"
		}
		path := "/token/" + strconv.FormatInt(seq.Add(1), 10)
		mu.Lock()
		answers[path] = a
		mu.Unlock()
		defer func() { mu.Lock(); delete(answers, path); mu.Unlock() }()

		cfg := &oauth2.Config{ClientID: "c", ClientSecret: "s",
			Endpoint: oauth2.Endpoint{TokenURL: srv.URL + path, AuthStyle: oauth2.AuthStyleInHeader}}
		g, err := NewRefresher(cfg, client).Refresh(context.Background(), domain.NewSecret(marker))
		if err == nil {
			if g.AccessToken.IsZero() {
				t.Fatalf("status %d: success without an access token", a.status)
			}
			return
		}
		if g != (domain.Grant{}) {
			t.Fatalf("error %v came with a grant", err)
		}
		var pe *domain.ProviderError
		if !errors.As(err, &pe) || (!errors.Is(err, domain.ErrProviderUnavailable) && !errors.Is(err, domain.ErrGrantRevoked)) {
			t.Fatalf("unclassified error %T: %v", err, err)
		}
		if pe.RetryAfter < 0 {
			t.Fatalf("negative Retry-After %v", pe.RetryAfter)
		}
		if strings.Contains(err.Error(), marker) && !strings.Contains(string(body), marker) {
			t.Fatalf("the refresh token we sent leaked into the error: %v", err)
		}
	})
}

func abs(n int) int {
	if n < 0 {
		if -n < 0 { // math.MinInt
			return 0
		}
		return -n
	}
	return n
}
