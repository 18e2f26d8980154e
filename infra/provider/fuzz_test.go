package provider

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
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
// content type, Retry-After and body) to Refresher.Refresh with the default
// auth style (auto). It must never panic, must return either a grant with
// an access token or an error, errors must be classified as the table
// says for the statuses that decide alone, and must carry neither the
// refresh token nor the client secret, even when the answer echoes them.
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
	// Quirks of real providers, and the statuses that decide alone.
	f.Add(200, false, "", []byte(`{"ok":false,"error":"invalid_refresh_token"}`))
	f.Add(200, false, "", []byte(`{"ok":false}`))
	f.Add(200, false, "", []byte(`{"ok":true,"access_token":"at","error":""}`))
	f.Add(400, false, "", []byte(`{"status":"BAD_REFRESH_TOKEN","message":"rt-fuzz-marker"}`))
	f.Add(400, false, "", []byte(`{"status":"rt-fuzz-marker"}`))
	f.Add(200, false, "", []byte(`{"access_token":"at","expires_in":3599.5,"refresh_token_expires_in":"7776000"}`))
	f.Add(200, false, "", []byte(`{"access_token":"at","x_refresh_token_expires_in":8726400,"refresh_token_expires_in":null}`))
	f.Add(200, false, "", []byte(`{"access_token":"at","expires_in":"NaN","refresh_token_expires_in":"Inf"}`))
	f.Add(200, false, "", []byte(`{"access_token":"at","expires_in":"1e400","refresh_token_expires_in":1e-300}`))
	f.Add(200, false, "", []byte(`{"access_token":"at","expires_in":" 3600 ","token_type":"MAC"}`))
	f.Add(200, true, "", []byte(`access_token=at&refresh_token_expires_in=100&expires_in=3599.5`))
	f.Add(400, true, "", []byte(`error=invalid_grant&error_description=rt-fuzz-marker`))
	f.Add(401, false, "", []byte(``))
	f.Add(401, false, "", []byte(`{"error":"invalid_grant"}`))
	f.Add(404, false, "", []byte(`<html>not found</html>`))
	f.Add(405, false, "", []byte(`{"error":"invalid_grant"}`))
	f.Add(308, false, "", []byte(``))

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

	const marker, clientSecret = "rt-fuzz-marker", "cs-fuzz-secret"
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

		cfg := &oauth2.Config{ClientID: "c", ClientSecret: clientSecret,
			Endpoint: oauth2.Endpoint{TokenURL: srv.URL + path}}
		start := time.Now()
		g, err := NewRefresher(cfg, client).Refresh(context.Background(), domain.NewSecret(marker))
		if err == nil {
			if g.AccessToken.IsZero() {
				t.Fatalf("status %d: success without an access token", a.status)
			}
			if (!g.Expiry.IsZero() && g.Expiry.Before(start)) || (!g.RefreshExpiry.IsZero() && g.RefreshExpiry.Before(start)) {
				t.Fatalf("expiry in the past: %v, %v", g.Expiry, g.RefreshExpiry)
			}
			return
		}
		if !reflect.DeepEqual(g, domain.Grant{}) {
			t.Fatalf("error %v came with a grant", err)
		}
		var pe *domain.ProviderError
		if !errors.As(err, &pe) || !errors.Is(err, pe.Class.Sentinel()) {
			t.Fatalf("unclassified error %T: %v", err, err)
		}
		// The status decides alone when an answer was read; with none (a
		// header the transport refused) the failure is transient.
		switch st := pe.HTTPStatus; {
		case st == 0:
			if pe.Class != domain.Transient {
				t.Fatalf("no answer: class %v: %v", pe.Class, err)
			}
		case st >= 300 && st < 400, st == 404, st == 405:
			if pe.Class != domain.EndpointMisconfigured {
				t.Fatalf("status %d: class %v: %v", st, pe.Class, err)
			}
		case st >= 500, st == 429:
			if pe.Class != domain.Transient {
				t.Fatalf("status %d: class %v: %v", st, pe.Class, err)
			}
		}
		if _, known := codes[pe.Code]; !known && pe.Code != "" && pe.Code != "unrecognized_error" {
			t.Fatalf("code %q echoed", pe.Code)
		}
		if pe.RetryAfter < 0 {
			t.Fatalf("negative Retry-After %v", pe.RetryAfter)
		}
		if msg := fmt.Sprintf("%v %+v %#v", err, pe, pe); strings.Contains(msg, marker) || strings.Contains(msg, clientSecret) {
			t.Fatalf("a secret we sent leaked into the error: %v", err)
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
