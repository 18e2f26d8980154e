package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/apiclient"
	"github.com/tokenguard/tokenguard/infra/httpapi/problem"
)

func TestClassifyMapsDomainErrorsOnce(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("token for acme: %w", err) }
	for _, c := range []struct {
		err        error
		status     int
		code       string
		retryAfter string
	}{
		{wrap(domain.ErrInvalidConnection), http.StatusBadRequest, "invalid_connection", ""},
		{wrap(domain.ErrNotFound), http.StatusNotFound, "not_found", ""},
		{wrap(fmt.Errorf("%w: %w", domain.ErrNeedsReauth, &domain.ProviderError{Code: "invalid_grant", Class: domain.GrantDead})),
			http.StatusConflict, "needs_reauth", ""},
		{wrap(domain.ErrLockTimeout), http.StatusServiceUnavailable, "busy", "1"},
		{wrap(&domain.ProviderError{HTTPStatus: 429, RetryAfter: 3 * time.Second}), http.StatusServiceUnavailable, "provider_unavailable", "3"},
		{wrap(&domain.ProviderError{Err: errors.New("connection refused")}), http.StatusServiceUnavailable, "provider_unavailable", "1"},
		{wrap(&domain.ProviderError{Code: "invalid_client", HTTPStatus: 401, Class: domain.ClientRejected}),
			http.StatusServiceUnavailable, "client_rejected", "1"},
		{wrap(fmt.Errorf("%w (provider not called for 1s)", &domain.ProviderError{HTTPStatus: 404, Class: domain.EndpointMisconfigured})),
			http.StatusServiceUnavailable, "provider_misconfigured", "1"},
		{wrap(domain.ErrStoreUnavailable), http.StatusServiceUnavailable, "store_unavailable", "1"},
		{wrap(errors.Join(&domain.ProviderError{Err: errors.New("connection refused")}, fmt.Errorf("save: %w: conn closed", domain.ErrStoreUnavailable))),
			http.StatusServiceUnavailable, "store_unavailable", "1"},
		{fmt.Errorf("GET /resource: %w: %w", apiclient.ErrUnavailable, domain.ErrStoreUnavailable), http.StatusServiceUnavailable, "store_unavailable", "1"},
		{fmt.Errorf("GET /resource: %w: timeout", apiclient.ErrUnavailable), http.StatusBadGateway, "upstream_unavailable", ""},
		{errors.New("something else"), http.StatusInternalServerError, "internal", ""},
	} {
		w := httptest.NewRecorder()
		writeError(w, "acme", c.err)
		if w.Code != c.status || w.Header().Get("Retry-After") != c.retryAfter || w.Header().Get("Content-Type") != "application/json" {
			t.Errorf("%v: %d Retry-After %q, want %d %q", c.err, w.Code, w.Header().Get("Retry-After"), c.status, c.retryAfter)
		}
		if got := problem.Of(c.err).Code; got != c.code {
			t.Errorf("%v: code %q, want %q", c.err, got, c.code)
		}
	}
}

func TestNeedsReauthAnswerSaysHowToConnect(t *testing.T) {
	w := httptest.NewRecorder()
	writeError(w, "acme", fmt.Errorf("x: %w", domain.ErrNeedsReauth))
	want := `{"error":"x: connection needs re-authorisation; connect it again (POST /connect-sessions)","code":"needs_reauth","connection":"acme"}` + "\n"
	if w.Body.String() != want {
		t.Errorf("body = %s, want %s", w.Body, want)
	}
}
