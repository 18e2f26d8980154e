package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/apiclient"
)

// errorBody is every error answer: a stable code to branch on and a
// message for people. Neither ever carries a token.
type errorBody struct {
	Error      string `json:"error"`
	Code       string `json:"code"`
	Connection string `json:"connection,omitempty"`
}

// problem is how an error is answered.
type problem struct {
	status     int
	code       string
	message    string
	retryAfter time.Duration
}

// classify maps an error from the layers below to its HTTP answer. It is
// the only place that does.
func classify(err error) problem {
	var pe *domain.ProviderError
	switch {
	case errors.Is(err, domain.ErrInvalidConnection):
		return problem{http.StatusBadRequest, "invalid_connection", err.Error(), 0}
	case errors.Is(err, domain.ErrInvalidMetadata):
		return problem{http.StatusBadRequest, "invalid_metadata", err.Error(), 0}
	case errors.Is(err, domain.ErrUndecryptable):
		// Not the store's 503: trying again gives the same answer.
		return problem{http.StatusInternalServerError, "undecryptable",
			"the connection's stored token cannot be decrypted (TOKEN_ENCRYPTION_KEYS, or the row was altered or rolled back); nothing was served", 0}
	case errors.Is(err, domain.ErrInvalidAccount):
		return problem{http.StatusBadGateway, "account_invalid", "the provider named the account with an id that is too long or not printable; nothing was stored", 0}
	case errors.Is(err, domain.ErrNoAPIBaseURL):
		return problem{http.StatusConflict, "no_api_base_url", err.Error(), 0}
	case errors.Is(err, domain.ErrUnknownProvider):
		return problem{http.StatusBadRequest, "unknown_provider", err.Error(), 0}
	case errors.Is(err, domain.ErrNotFound):
		return problem{http.StatusNotFound, "not_found", "connection not found", 0}
	case errors.Is(err, domain.ErrNeedsReauth):
		return problem{http.StatusConflict, "needs_reauth", err.Error() + "; connect it again (POST /connect-sessions)", 0}
	case errors.Is(err, domain.ErrAccountMismatch):
		return problem{http.StatusConflict, "account_mismatch", err.Error(), 0}
	case errors.Is(err, domain.ErrResultInvalid):
		return problem{http.StatusGone, "result_invalid", "this connect result is unknown, expired or already redeemed; nothing was stored", 0}
	case errors.Is(err, domain.ErrUnauthorized):
		return problem{http.StatusUnauthorized, "unauthorized", "unauthorized", 0}
	case errors.Is(err, domain.ErrRefreshRateLimited):
		return problem{http.StatusTooManyRequests, "refresh_rate_limited",
			"the connection was refreshed after a 401 moments ago; the API refuses the new token too", time.Second}
	case errors.Is(err, domain.ErrLockTimeout):
		return problem{http.StatusServiceUnavailable, "busy", "another process is refreshing the token; try again", time.Second}
	// Before the provider's errors: a store failure beside a provider
	// answer (a refresh whose outcome could not be stored) is the store's,
	// and never an upstream's 502.
	case errors.Is(err, domain.ErrStoreUnavailable):
		return problem{http.StatusServiceUnavailable, "store_unavailable", "the token store is unavailable; try again", time.Second}
	case errors.Is(err, domain.ErrClientRejected):
		return problem{http.StatusServiceUnavailable, "client_rejected",
			"the token provider rejects this client; check OAUTH_CLIENT_ID, OAUTH_CLIENT_SECRET and OAUTH_AUTH_STYLE", time.Second}
	case errors.Is(err, domain.ErrEndpointMisconfigured):
		return problem{http.StatusServiceUnavailable, "provider_misconfigured",
			"the token URL does not answer as a token endpoint; check OAUTH_TOKEN_URL", time.Second}
	case errors.Is(err, domain.ErrRefreshFailing):
		return problem{http.StatusServiceUnavailable, "refresh_failing",
			"the connection's refreshes are failing; the provider is asked again later (GET /connections shows why)", 5 * time.Second}
	case errors.As(err, &pe) && pe.Class != domain.GrantDead:
		return problem{http.StatusServiceUnavailable, "provider_unavailable", "the token provider is unavailable; try again",
			max(pe.RetryAfter, time.Second)}
	case errors.Is(err, domain.ErrProviderUnavailable):
		return problem{http.StatusServiceUnavailable, "provider_unavailable", "the token provider is unavailable; try again", time.Second}
	case errors.Is(err, apiclient.ErrTooLarge):
		return problem{http.StatusBadGateway, "upstream_too_large", "the external API's answer is over the size limit; nothing of it was passed on", 0}
	case errors.Is(err, apiclient.ErrUnavailable):
		return problem{http.StatusBadGateway, "upstream_unavailable", "the external API could not be reached", 0}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return problem{http.StatusServiceUnavailable, "timeout", "the request timed out", time.Second}
	}
	return problem{http.StatusInternalServerError, "internal", "internal error", 0}
}

func writeError(w http.ResponseWriter, connection string, err error) {
	p := classify(err)
	body := errorBody{Error: p.message, Code: p.code, Connection: connection}
	if p.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((p.retryAfter+time.Second-1)/time.Second)))
	}
	writeJSON(w, p.status, body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	if e, ok := v.(errorBody); ok {
		// Tells tokenguard's own errors from the API's answers the proxy
		// passes on (a 401 there is the API's, here the key's).
		w.Header().Set("Tokenguard-Error", e.Code)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
