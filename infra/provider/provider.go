// Package provider talks to the OAuth2 provider's token endpoint through
// golang.org/x/oauth2 and turns its answers into domain values and errors.
package provider

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
)

// NewHTTPClient returns a client for the token endpoint whose every phase
// is bounded, so a provider that stops answering cannot hold a
// connection's lock for longer than timeout.
func NewHTTPClient(timeout time.Duration) *http.Client {
	dialer := &net.Dialer{Timeout: min(5*time.Second, timeout), KeepAlive: 30 * time.Second}
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           dialer.DialContext,
			TLSHandshakeTimeout:   min(5*time.Second, timeout),
			ResponseHeaderTimeout: timeout,
			IdleConnTimeout:       90 * time.Second,
			MaxIdleConnsPerHost:   4,
			ForceAttemptHTTP2:     true,
		},
		// A token endpoint has no business redirecting a POST with credentials.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// Refresher redeems refresh tokens with an oauth2.Config.
type Refresher struct {
	cfg    *oauth2.Config
	client *http.Client
}

// NewRefresher uses cfg's client credentials and token URL, and client for
// the HTTP calls (NewHTTPClient when nil).
func NewRefresher(cfg *oauth2.Config, client *http.Client) *Refresher {
	if client == nil {
		client = NewHTTPClient(10 * time.Second)
	}
	return &Refresher{cfg: cfg, client: client}
}

// Refresh redeems refreshToken. Errors are *domain.ProviderError.
func (r *Refresher) Refresh(ctx context.Context, refreshToken domain.Secret) (domain.Grant, error) {
	ctx = context.WithValue(ctx, oauth2.HTTPClient, r.client)
	// A token with only a refresh token is invalid, so the source goes
	// straight to the token endpoint.
	tok, err := r.cfg.TokenSource(ctx, &oauth2.Token{RefreshToken: refreshToken.Reveal()}).Token()
	if err != nil {
		return domain.Grant{}, classify(ctx, err)
	}
	return GrantFrom(tok), nil
}

// GrantFrom converts an x/oauth2 token.
func GrantFrom(tok *oauth2.Token) domain.Grant {
	return domain.Grant{
		AccessToken:  domain.NewSecret(tok.AccessToken),
		TokenType:    tok.Type(),
		RefreshToken: domain.NewSecret(tok.RefreshToken),
		Expiry:       tok.Expiry,
	}
}

// codeClasses: the RFC 6749 §5.2 codes that are not transient.
var codeClasses = map[string]domain.ErrorClass{
	"invalid_grant":          domain.GrantDead,
	"invalid_client":         domain.ClientRejected,
	"unauthorized_client":    domain.ClientRejected,
	"unsupported_grant_type": domain.ClientRejected,
	"invalid_scope":          domain.ClientRejected,
}

// knownCodes are the token endpoint error codes of RFC 6749 §5.2 and the
// ones providers commonly add. Anything else is reported as
// "unrecognized_error": the code ends up in errors, logs and the stored
// status reason, and a broken or hostile provider could put anything
// there, the credentials it was sent included.
var knownCodes = map[string]bool{
	"invalid_request": true, "invalid_client": true, "invalid_grant": true, "unauthorized_client": true,
	"unsupported_grant_type": true, "invalid_scope": true, "temporarily_unavailable": true,
	"server_error": true, "access_denied": true, "slow_down": true, "invalid_token": true,
}

func errorCode(code string) string {
	if code == "" || knownCodes[code] {
		return code
	}
	return "unrecognized_error"
}

// classify maps an x/oauth2 error to a *domain.ProviderError. It never
// keeps *oauth2.RetrieveError itself: its Error() prints the response body.
func classify(ctx context.Context, err error) error {
	var re *oauth2.RetrieveError
	if !errors.As(err, &re) {
		// Transport failure: no answer, or one x/oauth2 could not parse.
		if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ctxErr) {
			err = errors.Join(ctxErr, err)
		}
		return &domain.ProviderError{Err: err}
	}
	pe := &domain.ProviderError{Code: errorCode(re.ErrorCode), Class: codeClasses[re.ErrorCode]}
	if re.Response != nil {
		pe.HTTPStatus = re.Response.StatusCode
		pe.RetryAfter = retryAfter(re.Response.Header.Get("Retry-After"), time.Now())
	}
	return pe
}

// retryAfter reads a Retry-After header in either of its forms.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if secs, err := strconv.Atoi(v); err == nil && secs >= 0 {
		return time.Duration(secs) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}
