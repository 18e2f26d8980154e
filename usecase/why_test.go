package usecase_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// timeoutErr is a transport error that timed out (net.Error's Timeout).
type timeoutErr struct{}

func (timeoutErr) Error() string { return "dial tcp: i/o timeout" }
func (timeoutErr) Timeout() bool { return true }

// A refresh that stores nothing notes why, for the connection's history:
// the failure, with the provider's status and code. A dead grant notes
// nothing: its reason is stored with the needs_reauth status.
func TestRefreshThatStoresNothingNotesWhy(t *testing.T) {
	for _, c := range []struct {
		err  *domain.ProviderError
		want string
	}{
		{&domain.ProviderError{Lost: true, Err: context.DeadlineExceeded}, "timeout: no answer within "},
		{&domain.ProviderError{Lost: true, Err: io.EOF}, "answer lost: the connection dropped after the request was sent (no answer)"},
		{&domain.ProviderError{HTTPStatus: 400, Code: "unrecognized_error", Class: domain.Unclassified}, "unclassified answer: HTTP 400 unrecognized_error"},
		{&domain.ProviderError{HTTPStatus: 400, Class: domain.Unclassified}, "unclassified answer: HTTP 400 no code"},
		{&domain.ProviderError{HTTPStatus: 503, Code: "temporarily_unavailable"}, "not stored: provider unavailable (HTTP 503 temporarily_unavailable)"},
		{&domain.ProviderError{Err: timeoutErr{}}, "not stored: timeout before the request was sent; provider unavailable"},
		{&domain.ProviderError{HTTPStatus: 401, Code: "invalid_client", Class: domain.ClientRejected}, "not stored: the token endpoint rejected the client (HTTP 401 invalid_client)"},
		{&domain.ProviderError{HTTPStatus: 404, Class: domain.EndpointMisconfigured}, "not stored: the token URL does not answer as a token endpoint (HTTP 404 no code)"},
		{&domain.ProviderError{HTTPStatus: 400, Code: "invalid_grant", Class: domain.GrantDead}, ""},
	} {
		uc, store, ref, _ := setup(t, -time.Second)
		ref.err = c.err
		if _, err := uc.Token(context.Background(), "acme"); err == nil || errors.Is(err, context.Canceled) {
			t.Fatalf("%v: Token did not fail: %v", c.err, err)
		}
		got := ""
		if len(store.whys) > 0 {
			got = store.whys[len(store.whys)-1]
		}
		if len(store.whys) > 1 || len(got) < len(c.want) || got[:len(c.want)] != c.want || (c.want == "") != (got == "") {
			t.Errorf("%v (%s): noted %q, want %q", c.err, c.err.Class, store.whys, c.want)
		}
	}
}
