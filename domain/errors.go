package domain

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors, for errors.Is; the layers below wrap them never with a secret.
var (
	ErrNotFound = errors.New("connection not found")
	// ErrNeedsReauth: the provider rejected the grant; a person must connect again.
	ErrNeedsReauth = errors.New("connection needs re-authorisation")
	ErrLockTimeout = errors.New("timed out waiting for the connection's refresh lock")
	// ErrProviderUnavailable: the provider failed in a way a later call may not (5xx, 429, timeout, network).
	ErrProviderUnavailable = errors.New("token provider unavailable")
	// ErrGrantRevoked: the provider says the grant itself is dead (invalid_grant or a synonym).
	ErrGrantRevoked = errors.New("grant rejected by the provider")
	// ErrClientRejected: the provider rejected the client, not the grant; the refresh token was not spent.
	ErrClientRejected = errors.New("token endpoint rejected the client (check the oauth2.Config's ClientID, ClientSecret, Endpoint.AuthStyle)")
	// ErrEndpointMisconfigured: the token URL is not a token endpoint (404, 405, a redirect).
	ErrEndpointMisconfigured = errors.New("token endpoint misconfigured (check the oauth2.Config's Endpoint.TokenURL)")
	ErrStoreUnavailable      = errors.New("token store unavailable")
	ErrReadOnlyStore         = errors.New("token store is a read-only replica")
	// ErrRefreshInProgress: the token is not presented again until that refresh has stored its answer or given up.
	ErrRefreshInProgress = errors.New("another process's refresh of the token may still be at the provider")
	ErrConflict          = errors.New("token changed concurrently")
	// ErrInvalidToken: a token handed to us is unusable (for example it has no refresh token).
	ErrInvalidToken      = errors.New("invalid token")
	ErrInvalidConnection = errors.New("invalid connection name")
	// ErrRefreshRateLimited: forced refreshes came too fast (an API answering 401 to everything).
	ErrRefreshRateLimited = errors.New("forced refresh rate limited")
	// ErrAccountMismatch: the session did not allow a change of account; nothing was stored.
	ErrAccountMismatch = errors.New("the grant is from a different provider account than the connection's")
	// ErrInvalidSyncCommit: a level other than off, local, remote_write, on or remote_apply.
	ErrInvalidSyncCommit    = errors.New("invalid synchronous_commit level")
	ErrReturnToNotAllowed   = errors.New("return_to is missing or not under an allowed return URL (CONNECT_RETURN_URLS)")
	ErrConnectNotConfigured = errors.New("the connect flow is not configured (OAUTH_AUTH_URL, OAUTH_TOKEN_URL, OAUTH_REDIRECT_URL)")
	// ErrUnauthorized: a missing, unknown or revoked API key or connect session.
	ErrUnauthorized   = errors.New("unauthorized")
	ErrSchemaNotFound = errors.New("the search_path names a schema that does not exist")
	// ErrRefreshFailing: unclassified or lost answers, the next attempt not due yet (grant untouched).
	ErrRefreshFailing = errors.New("the connection's refreshes are failing; the provider is not asked again yet")
	ErrResultInvalid  = errors.New("connect result unknown, expired or already redeemed")
	// ErrUndecryptable: a stored token's key is missing or its ciphertext altered; it is never sent.
	ErrUndecryptable     = errors.New("stored token cannot be decrypted")
	ErrSenderConstrained = errors.New("connection is sender-constrained (DPoP): its access token is useless without a proof; call through tokenguard's client or proxy, or ask for a proof (POST /connections/{name}/dpop-proof)")
)

// ConnectError says why the connect flow's callback stored nothing. No field carries a secret.
type ConnectError struct {
	Code    string // reported to the browser: bad_state, exchange_failed, or the provider's (access_denied)
	Message string // for people
	Err     error  // the cause; may be nil
}

func (e *ConnectError) Error() string { return "connect flow: " + e.Code + ": " + e.Message }

func (e *ConnectError) Unwrap() error { return e.Err }

// ProviderError describes a failed token request, never with the response
// body, which a provider may fill with anything, even the credentials sent.
type ProviderError struct {
	Code        string        // OAuth2 error code such as "invalid_grant"; empty for transport failures
	HTTPStatus  int           // 0 when no response arrived
	RetryAfter  time.Duration // from a Retry-After header, when the provider sent one
	Class       ErrorClass    // what the answer means for the grant
	Err         error         // transport cause (already free of secrets), or nil
	Lost        bool          // the request was sent and its answer lost: the refresh token may be spent
	ReplayUntil time.Time     // ends a Lost answer's reuse grace window; zero: never present the refresh token again
	NoReplay    bool          // the profile declares no reuse grace window
	Ambiguous   bool          // a refusal that could be about the client or the grant (invalid_request, a bare 400)
	Evidence    string        // what decided an Ambiguous refusal's Class: an Evidence* value, or "" (unclassified)
}

// The evidence that decides an ambiguous refusal (ProviderError.Evidence).
const (
	// EvidenceFingerprint (grant dead): the provider gave this answer to a
	// refresh token that cannot exist, with a client it did not refuse.
	EvidenceFingerprint = "fingerprint"
	// EvidenceClientWorks (grant refused, failing at once): the same client
	// credentials in the same auth style refreshed another grant recently.
	EvidenceClientWorks = "client_works"
)

// ErrorClass is what a token endpoint's answer means for the grant, as the provider adapter's table decides.
type ErrorClass int

const (
	// Transient: 5xx, 429, timeouts, network errors. Retried; the stored token is untouched.
	Transient ErrorClass = iota
	// GrantDead: the grant is gone (invalid_grant); the only class that may mark needs_reauth, after a re-read.
	GrantDead
	ClientRejected        // the client's registration or credentials are wrong; the refresh token was not spent
	EndpointMisconfigured // the token URL does not lead to a token endpoint; no grant is touched
	// Unclassified: an answer tokenguard cannot act on (an unknown code, an unreadable body, a 200
	// without an access token). Not retried in the call: the connection backs off fleet-wide.
	Unclassified
)

// classes names each class (as metrics and logs show it) and its sentinel.
var classes = [...]struct {
	name     string
	sentinel error
}{
	Transient:             {"transient", ErrProviderUnavailable},
	GrantDead:             {"grant_dead", ErrGrantRevoked},
	ClientRejected:        {"client_rejected", ErrClientRejected},
	EndpointMisconfigured: {"endpoint_misconfigured", ErrEndpointMisconfigured},
	Unclassified:          {"unclassified", ErrProviderUnavailable},
}

// String names the class as metrics and logs show it.
func (c ErrorClass) String() string { return classes[c.known()].name }

// Sentinel is the error of errors.Is that stands for the class.
func (c ErrorClass) Sentinel() error { return classes[c.known()].sentinel }

// known is c, or Transient for a class the table lacks.
func (c ErrorClass) known() ErrorClass {
	if c < 0 || int(c) >= len(classes) {
		return Transient
	}
	return c
}

func (e *ProviderError) Error() string {
	msg := "token refresh failed"
	if e.Code != "" {
		msg += ": " + e.Code
	}
	if e.HTTPStatus != 0 {
		msg += fmt.Sprintf(" (HTTP %d)", e.HTTPStatus)
	}
	if e.Lost {
		msg += ": the request was sent and its answer lost"
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	if e.Class == ClientRejected || e.Class == EndpointMisconfigured {
		msg += ": " + e.Class.Sentinel().Error() // what to check
	}
	return msg
}

// Unwrap lets errors.Is match the class's sentinel and the transport cause (context.DeadlineExceeded).
func (e *ProviderError) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Class.Sentinel()}
	}
	return []error{e.Class.Sentinel(), e.Err}
}
