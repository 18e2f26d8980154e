package domain

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Callers branch on them with errors.Is; the layers below
// wrap them with context and never with a secret.
var (
	// ErrNotFound: no connection by that name is stored.
	ErrNotFound = errors.New("connection not found")
	// ErrNeedsReauth: the provider rejected the grant; a person must connect again.
	ErrNeedsReauth = errors.New("connection needs re-authorisation")
	// ErrLockTimeout: another process held the connection's refresh lock for longer than the wait bound.
	ErrLockTimeout = errors.New("timed out waiting for the connection's refresh lock")
	// ErrProviderUnavailable: the provider failed in a way a later call may not (5xx, 429, timeout, network).
	ErrProviderUnavailable = errors.New("token provider unavailable")
	// ErrGrantRevoked: the provider says the grant itself is dead
	// (invalid_grant and the few non-standard codes that mean the same).
	ErrGrantRevoked = errors.New("grant rejected by the provider")
	// ErrClientRejected: the provider rejected the client, not the grant
	// (invalid_client, unauthorized_client, unsupported_grant_type, a 401
	// from the token endpoint). The refresh token was not spent; the
	// connection stays active and recovers once the client is accepted.
	// Messages name the oauth2.Config fields; the bundled apps name their
	// settings in their own messages.
	ErrClientRejected = errors.New("token endpoint rejected the client (check the oauth2.Config's ClientID, ClientSecret, Endpoint.AuthStyle)")
	// ErrEndpointMisconfigured: the token URL is not a token endpoint (404,
	// 405, a redirect). No grant was touched.
	ErrEndpointMisconfigured = errors.New("token endpoint misconfigured (check the oauth2.Config's Endpoint.TokenURL)")
	// ErrStoreUnavailable: the database could not be reached or failed.
	ErrStoreUnavailable = errors.New("token store unavailable")
	// ErrReadOnlyStore: the database is a replica (in recovery), where
	// no refresh could be stored.
	ErrReadOnlyStore = errors.New("token store is a read-only replica")
	// ErrRefreshInProgress: another process's refresh of the same stored
	// token may still be at the provider although that process lost the
	// connection's lock (its database session ended mid-refresh). Its
	// refresh token must not be presented again until that refresh has
	// stored its answer or given up.
	ErrRefreshInProgress = errors.New("another process's refresh of the token may still be at the provider")
	// ErrConflict: the stored token changed between read and write.
	ErrConflict = errors.New("token changed concurrently")
	// ErrInvalidToken: a token handed to us is unusable (for example it has no refresh token).
	ErrInvalidToken = errors.New("invalid token")
	// ErrInvalidConnection: a connection name is malformed.
	ErrInvalidConnection = errors.New("invalid connection name")
	// ErrRefreshRateLimited: forced refreshes of a connection came faster
	// than allowed (an API answering 401 to everything).
	ErrRefreshRateLimited = errors.New("forced refresh rate limited")
	// ErrAccountMismatch: a new grant for a connection comes from another
	// provider account than the stored one, and the connect session did
	// not allow the change. Nothing was stored.
	ErrAccountMismatch = errors.New("the grant is from a different provider account than the connection's")
	// ErrInvalidSyncCommit: a synchronous_commit level for the token
	// writes other than off, local, remote_write, on or remote_apply.
	ErrInvalidSyncCommit = errors.New("invalid synchronous_commit level")
	// ErrConnectNotConfigured: a connect session was asked of a server that
	// runs no connect flow (it needs OAUTH_AUTH_URL, OAUTH_TOKEN_URL and
	// OAUTH_REDIRECT_URL).
	ErrConnectNotConfigured = errors.New("the connect flow is not configured (OAUTH_AUTH_URL, OAUTH_TOKEN_URL, OAUTH_REDIRECT_URL)")
	// ErrUnauthorized: a missing, unknown or revoked API key or connect
	// session.
	ErrUnauthorized = errors.New("unauthorized")
)

// ProviderError describes a failed token request. It carries the OAuth2
// error code and HTTP status but never the response body, which a provider
// may fill with anything, including the credentials it was sent.
type ProviderError struct {
	Code       string        // OAuth2 error code such as "invalid_grant"; empty for transport failures
	HTTPStatus int           // 0 when no response arrived
	RetryAfter time.Duration // from a Retry-After header, when the provider sent one
	Class      ErrorClass    // what the answer means for the grant
	Err        error         // transport cause (already free of secrets), or nil
}

// ErrorClass is what a token endpoint's answer means for the grant. The
// provider adapter decides it, in one table; the use case acts on it.
type ErrorClass int

const (
	// Transient: 5xx, 429, timeouts, network errors, unparsable or unknown
	// answers. Retried; the stored token is untouched.
	Transient ErrorClass = iota
	// GrantDead: the grant is gone (invalid_grant). The only class that may
	// mark a connection needs_reauth, after a re-read.
	GrantDead
	// ClientRejected: the client's registration or credentials are wrong;
	// the refresh token was not spent. No grant is touched.
	ClientRejected
	// EndpointMisconfigured: the token URL does not lead to a token
	// endpoint. No grant is touched.
	EndpointMisconfigured
)

// String names the class as metrics and logs show it.
func (c ErrorClass) String() string {
	switch c {
	case GrantDead:
		return "grant_dead"
	case ClientRejected:
		return "client_rejected"
	case EndpointMisconfigured:
		return "endpoint_misconfigured"
	}
	return "transient"
}

// Sentinel is the error of errors.Is that stands for the class.
func (c ErrorClass) Sentinel() error {
	switch c {
	case GrantDead:
		return ErrGrantRevoked
	case ClientRejected:
		return ErrClientRejected
	case EndpointMisconfigured:
		return ErrEndpointMisconfigured
	}
	return ErrProviderUnavailable
}

func (e *ProviderError) Error() string {
	msg := "token refresh failed"
	if e.Code != "" {
		msg += ": " + e.Code
	}
	if e.HTTPStatus != 0 {
		msg += fmt.Sprintf(" (HTTP %d)", e.HTTPStatus)
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	if e.Class == ClientRejected || e.Class == EndpointMisconfigured {
		msg += ": " + e.Class.Sentinel().Error() // what to check
	}
	return msg
}

// Unwrap lets errors.Is match the class's sentinel (ErrGrantRevoked,
// ErrClientRejected, ErrEndpointMisconfigured or ErrProviderUnavailable) and
// the transport cause (context.DeadlineExceeded, net errors).
func (e *ProviderError) Unwrap() []error {
	kind := e.Class.Sentinel()
	if e.Err == nil {
		return []error{kind}
	}
	return []error{kind, e.Err}
}
