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
	// ErrGrantRevoked: the provider answered with a permanent error (invalid_grant and kin).
	ErrGrantRevoked = errors.New("grant rejected by the provider")
	// ErrStoreUnavailable: the database could not be reached or failed.
	ErrStoreUnavailable = errors.New("token store unavailable")
	// ErrConflict: the stored token changed between read and write.
	ErrConflict = errors.New("token changed concurrently")
	// ErrInvalidToken: a token handed to us is unusable (for example it has no refresh token).
	ErrInvalidToken = errors.New("invalid token")
	// ErrInvalidConnection: a connection name is malformed.
	ErrInvalidConnection = errors.New("invalid connection name")
	// ErrRefreshRateLimited: forced refreshes of a connection came faster
	// than allowed (an API answering 401 to everything).
	ErrRefreshRateLimited = errors.New("forced refresh rate limited")
)

// ProviderError describes a failed token request. It carries the OAuth2
// error code and HTTP status but never the response body, which a provider
// may fill with anything, including the credentials it was sent.
type ProviderError struct {
	Code       string        // OAuth2 error code such as "invalid_grant"; empty for transport failures
	HTTPStatus int           // 0 when no response arrived
	RetryAfter time.Duration // from a Retry-After header, when the provider sent one
	Permanent  bool          // retrying with the same refresh token cannot succeed
	Err        error         // transport cause (already free of secrets), or nil
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
	return msg
}

// Unwrap lets errors.Is match ErrGrantRevoked or ErrProviderUnavailable and
// the transport cause (context.DeadlineExceeded, net errors).
func (e *ProviderError) Unwrap() []error {
	kind := ErrProviderUnavailable
	if e.Permanent {
		kind = ErrGrantRevoked
	}
	if e.Err == nil {
		return []error{kind}
	}
	return []error{kind, e.Err}
}
