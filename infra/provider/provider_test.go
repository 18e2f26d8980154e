package provider

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
)

// tokenEndpoint answers every token request with status, headers and body.
func tokenEndpoint(t *testing.T, status int, header http.Header, body string) *oauth2.Config {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for k, v := range header {
			w.Header()[k] = v
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return &oauth2.Config{ClientID: "c", ClientSecret: "s", Endpoint: oauth2.Endpoint{TokenURL: srv.URL, AuthStyle: oauth2.AuthStyleInHeader}}
}

func TestRefreshClassifiesProviderAnswers(t *testing.T) {
	const leaked = "rt-secret-echoed-by-provider"
	cases := []struct {
		name       string
		status     int
		header     http.Header
		body       string
		permanent  bool
		code       string
		retryAfter time.Duration
	}{
		{"invalid_grant", 400, nil, `{"error":"invalid_grant","error_description":"token ` + leaked + ` was reused"}`, true, "invalid_grant", 0},
		{"invalid_client", 401, nil, `{"error":"invalid_client"}`, true, "invalid_client", 0},
		{"unauthorized_client", 400, nil, `{"error":"unauthorized_client"}`, true, "unauthorized_client", 0},
		{"503", 503, nil, `{"error":"temporarily_unavailable"}`, false, "temporarily_unavailable", 0},
		{"429 with Retry-After", 429, http.Header{"Retry-After": {"7"}}, `{"error":"temporarily_unavailable"}`, false, "temporarily_unavailable", 7 * time.Second},
		{"502 html", 502, nil, `<html>bad gateway ` + leaked + `</html>`, false, "", 0},
		{"400 without a code", 400, nil, `{}`, false, "", 0},
		{"code echoing the request", 400, nil, `{"error":"` + leaked + `"}`, false, "unrecognized_error", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := NewRefresher(tokenEndpoint(t, c.status, c.header, c.body), nil)
			_, err := r.Refresh(context.Background(), domain.NewSecret("rt"))
			var pe *domain.ProviderError
			if !errors.As(err, &pe) {
				t.Fatalf("err = %T %v, want *domain.ProviderError", err, err)
			}
			if (pe.Class != domain.Transient) != c.permanent || pe.Code != c.code || pe.HTTPStatus != c.status || pe.RetryAfter != c.retryAfter {
				t.Errorf("got %+v", *pe)
			}
			wantKind := domain.ErrProviderUnavailable
			if c.permanent {
				wantKind = pe.Class.Sentinel()
			}
			if !errors.Is(err, wantKind) {
				t.Errorf("errors.Is(%v, %v) = false", err, wantKind)
			}
			if strings.Contains(err.Error(), leaked) {
				t.Errorf("response body leaked into the error: %v", err)
			}
		})
	}
}

func TestRefreshSuccess(t *testing.T) {
	cfg := tokenEndpoint(t, 200, nil, `{"access_token":"at","token_type":"bearer","refresh_token":"rt2","expires_in":60}`)
	g, err := NewRefresher(cfg, nil).Refresh(context.Background(), domain.NewSecret("rt"))
	if err != nil {
		t.Fatal(err)
	}
	if g.AccessToken.Reveal() != "at" || g.RefreshToken.Reveal() != "rt2" || time.Until(g.Expiry) < 50*time.Second || g.TokenType != "Bearer" {
		t.Errorf("grant = %+v (expiry in %v)", g, time.Until(g.Expiry))
	}
}

func TestRefreshTransportFailuresAreTransient(t *testing.T) {
	// Nothing listens on a closed server's address.
	srv := httptest.NewServer(http.NotFoundHandler())
	srv.Close()
	cfg := &oauth2.Config{ClientID: "c", Endpoint: oauth2.Endpoint{TokenURL: srv.URL}}
	_, err := NewRefresher(cfg, nil).Refresh(context.Background(), domain.NewSecret("rt"))
	if !errors.Is(err, domain.ErrProviderUnavailable) {
		t.Errorf("connection refused: err = %v", err)
	}

	release := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(hang.Close)
	t.Cleanup(func() { close(release) })
	cfg.Endpoint.TokenURL = hang.URL
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = NewRefresher(cfg, nil).Refresh(ctx, domain.NewSecret("rt"))
	if !errors.Is(err, domain.ErrProviderUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("slow provider: err = %v, want ErrProviderUnavailable and DeadlineExceeded", err)
	}
}

func TestRetryAfterDate(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if got := retryAfter(now.Add(90*time.Second).Format(http.TimeFormat), now); got != 90*time.Second {
		t.Errorf("date form = %v", got)
	}
	if got := retryAfter("soon", now); got != 0 {
		t.Errorf("garbage = %v", got)
	}
}
