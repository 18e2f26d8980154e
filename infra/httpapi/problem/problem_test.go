package problem

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/tokenguard/tokenguard/domain"
)

// Every row answers both edges: a code for programs, a text for the API's
// callers (or the error's own) and a page for people.
func TestEveryRowAnswersBothEdges(t *testing.T) {
	for i, r := range append(table, row{p: internal}) {
		if r.p.Status < 400 || r.p.Code == "" || r.p.Page == "" || (r.p.Message == "" && !r.detail) {
			t.Errorf("row %d: %+v", i, r.p)
		}
	}
}

// The console and the API answer an error alike: the same status and code.
func TestConsoleAndAPIAgree(t *testing.T) {
	for _, c := range []struct {
		err    error
		status int
		code   string
	}{
		{fmt.Errorf("revoke: %w", domain.ErrNoRevocationEndpoint), http.StatusConflict, "no_revocation_endpoint"},
		{fmt.Errorf("revoke: %w: %w", domain.ErrProviderUnavailable, errors.New("timeout")), http.StatusServiceUnavailable, "provider_unavailable"},
		{fmt.Errorf("link: %w", domain.ErrReturnToNotAllowed), http.StatusBadRequest, "return_to_not_allowed"},
		{errors.New("anything else"), http.StatusInternalServerError, "internal"},
	} {
		if p := Of(c.err); p.Status != c.status || p.Code != c.code || p.Page == "" {
			t.Errorf("%v: %+v, want %d %s", c.err, p, c.status, c.code)
		}
	}
}

// Callers of a failing connection are told the provider's last answer;
// a refused client is not what they are told.
func TestRefreshFailingNamesTheAnswer(t *testing.T) {
	pe := &domain.ProviderError{HTTPStatus: 400, Code: "invalid_request", Class: domain.Unclassified, Ambiguous: true}
	p := Of(fmt.Errorf("%w: %w", domain.ErrRefreshFailing, pe))
	if p.Code != "refresh_failing" || !strings.Contains(p.Message, "HTTP 400 invalid_request") || !strings.Contains(p.Page, "HTTP 400 invalid_request") {
		t.Errorf("got %+v, want refresh_failing naming HTTP 400 invalid_request", p)
	}
	if p := Of(fmt.Errorf("%w", domain.ErrRefreshFailing)); strings.Contains(p.Message, "last answer") {
		t.Errorf("without an answer: %q", p.Message)
	}
}
