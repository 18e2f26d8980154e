// Package problem maps an error from the layers below to what the HTTP edges answer: the server's
// JSON errors and the operator console's pages. It is the only place that does.
package problem

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/apiclient"
)

// Problem is how an error is answered. None of its texts ever carries a token: where Message is the
// error's own text, the layers below keep secrets out of it.
type Problem struct {
	Status     int
	Code       string // stable, for programs (Tokenguard-Error)
	Message    string // for the API's callers
	Page       string // for a person, in the console
	RetryAfter time.Duration
}

// row is one line of the table: the first whose match holds decides.
type row struct {
	match       func(error) bool
	p           Problem
	detail      bool   // Message is the error's own text
	hint        string // added to the error's own text
	answerRetry bool   // RetryAfter is the provider's Retry-After, at least p's
	lastAnswer  bool   // the provider's last status and code go in Message and Page
}

func is(target error) func(error) bool {
	return func(err error) bool { return errors.Is(err, target) }
}

// detailed is the row of target whose Message is the error's own text.
func detailed(target error, status int, code, page string) row {
	return row{match: is(target), detail: true, p: Problem{Status: status, Code: code, Page: page}}
}

// fixed is the row of target with these texts (page "": message, as a
// sentence); wait > 0 is a RetryAfter.
func fixed(target error, status int, code string, wait time.Duration, message, page string) row {
	if page == "" {
		page = strings.ToUpper(message[:1]) + message[1:] + "."
	}
	return row{match: is(target), p: Problem{Status: status, Code: code, Message: message, Page: page, RetryAfter: wait}}
}

func timedOut(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// table is read in order: a store failure beside a provider answer (a refresh whose outcome could
// not be stored) is the store's, and never an upstream's 502.
var table = []row{
	detailed(domain.ErrInvalidConnection, http.StatusBadRequest, "invalid_connection", "That is not a connection name."),
	detailed(domain.ErrInvalidMetadata, http.StatusBadRequest, "invalid_metadata",
		"The metadata is not valid JSON of the kind a connection keeps."),
	// Not the store's 503: trying again gives the same answer.
	fixed(domain.ErrUndecryptable, http.StatusInternalServerError, "undecryptable", 0,
		"the connection's stored token cannot be decrypted (TOKEN_ENCRYPTION_KEYS, or the row was altered or rolled back); nothing was served", ""),
	fixed(domain.ErrInvalidAccount, http.StatusBadGateway, "account_invalid", 0,
		"the provider named the account with an id that is too long or not printable; nothing was stored", ""),
	detailed(domain.ErrNoAPIBaseURL, http.StatusConflict, "no_api_base_url",
		"Its provider has no API base URL: tokenctl provider update --api-base-url."),
	detailed(domain.ErrUnknownProvider, http.StatusBadRequest, "unknown_provider", "The connection's provider is not stored any more."),
	detailed(domain.ErrNoRevocationEndpoint, http.StatusConflict, "no_revocation_endpoint",
		"Its provider has no revocation endpoint configured: disconnect without revoking, or configure one."),
	detailed(domain.ErrReturnToNotAllowed, http.StatusBadRequest, "return_to_not_allowed",
		"The return address must be a page of your application under one of CONNECT_RETURN_URLS: the person's browser brings the consent's result there, and your backend redeems it (POST /connect-results)."),
	detailed(domain.ErrConnectionNotAllowed, http.StatusForbidden, "connection_not_allowed",
		"This API key's connection patterns do not include this connection (tokenctl apikey create --connections)."),
	detailed(domain.ErrMissingScope, http.StatusForbidden, "missing_scope",
		"This API key lacks the scope this needs (tokenctl apikey create --scopes)."),
	detailed(domain.ErrConnectNotConfigured, http.StatusServiceUnavailable, "connect_not_configured",
		"This server cannot create connect links: it needs OAUTH_AUTH_URL and OAUTH_REDIRECT_URL (or the provider's authorization URL)."),
	fixed(domain.ErrNotFound, http.StatusNotFound, "not_found", 0, "connection not found",
		"No such connection has a token (never connected, or disconnected)."),
	fixed(domain.ErrSenderConstrained, http.StatusConflict, "sender_constrained", 0,
		"the connection's grant is bound to a DPoP key: its token alone is useless; call through /connections/{name}/proxy, or POST /connections/{name}/dpop-proof for a proof of one request",
		"The connection's grant is bound to a DPoP key; its token is only used with a proof."),
	{match: is(domain.ErrNeedsReauth), detail: true, hint: "; connect it again (POST /connect-sessions)",
		p: Problem{Status: http.StatusConflict, Code: "needs_reauth", Page: "The connection's grant is dead: connect it again."}},
	detailed(domain.ErrAccountMismatch, http.StatusConflict, "account_mismatch",
		"The consent came from another provider account than the connection's; nothing was stored."),
	fixed(domain.ErrResultInvalid, http.StatusGone, "result_invalid", 0,
		"this connect result is unknown, expired or already redeemed; nothing was stored", ""),
	fixed(domain.ErrUnauthorized, http.StatusUnauthorized, "unauthorized", 0, "unauthorized", "Log in with an API key."),
	fixed(domain.ErrTokenBudgetSpent, http.StatusTooManyRequests, "token_budget_spent", time.Second,
		"the provider's token budget (--token-rate, OAUTH_TOKEN_RATE) is spent for now; the refresh waits for it; try again",
		"The provider's token budget is spent for now; the refresh waits for it. Try again in a moment."),
	fixed(domain.ErrRefreshRateLimited, http.StatusTooManyRequests, "refresh_rate_limited", time.Second,
		"the connection was refreshed after a 401 moments ago; the API refuses the new token too",
		"The connection was refreshed moments ago; try again shortly."),
	fixed(domain.ErrLockTimeout, http.StatusServiceUnavailable, "busy", time.Second,
		"another process is refreshing the token; try again",
		"The connection is busy (a refresh holds its lock); try again in a moment."),
	fixed(domain.ErrStoreUnavailable, http.StatusServiceUnavailable, "store_unavailable", time.Second,
		"the token store is unavailable; try again", "The database did not answer; try again."),
	fixed(domain.ErrClientRejected, http.StatusServiceUnavailable, "client_rejected", time.Second,
		"the token provider rejects this client; check OAUTH_CLIENT_ID, OAUTH_CLIENT_SECRET and OAUTH_AUTH_STYLE",
		"The provider rejects this client: check its client id, secret and auth style; nothing was changed."),
	fixed(domain.ErrEndpointMisconfigured, http.StatusServiceUnavailable, "provider_misconfigured", time.Second,
		"the token URL does not answer as a token endpoint; check OAUTH_TOKEN_URL",
		"The token URL does not answer as a token endpoint: check it; nothing was changed."),
	{match: is(domain.ErrRefreshFailing), lastAnswer: true,
		p: Problem{Status: http.StatusServiceUnavailable, Code: "refresh_failing", RetryAfter: 5 * time.Second,
			Message: "the connection's refreshes are failing; the provider is asked again later (GET /connections shows why)",
			Page:    "The connection's refreshes are failing; the provider is asked again later."}},
	{match: func(err error) bool { // a provider's answer that leaves the grant alive
		var pe *domain.ProviderError
		return errors.As(err, &pe) && pe.Class != domain.GrantDead
	}, p: providerUnavailable, answerRetry: true},
	{match: is(domain.ErrProviderUnavailable), p: providerUnavailable},
	fixed(apiclient.ErrTooLarge, http.StatusBadGateway, "upstream_too_large", 0,
		"the external API's answer is over the size limit; nothing of it was passed on",
		"The external API's answer is over the size limit."),
	fixed(apiclient.ErrUnavailable, http.StatusBadGateway, "upstream_unavailable", 0, "the external API could not be reached", ""),
	{match: timedOut,
		p: Problem{Status: http.StatusServiceUnavailable, Code: "timeout", RetryAfter: time.Second,
			Message: "the request timed out", Page: "The request timed out; try again."}},
}

var providerUnavailable = Problem{Status: http.StatusServiceUnavailable, Code: "provider_unavailable", RetryAfter: time.Second,
	Message: "the token provider is unavailable; try again",
	Page:    "The provider did not answer, or refused the request; nothing was changed. Try again."}

var internal = Problem{Status: http.StatusInternalServerError, Code: "internal", Message: "internal error",
	Page: "Something went wrong; the server's log says what."}

// Of is how err is answered.
func Of(err error) Problem {
	for _, r := range table {
		if !r.match(err) {
			continue
		}
		p := r.p
		if r.detail {
			p.Message = err.Error() + r.hint
		}
		var pe *domain.ProviderError
		if r.answerRetry && errors.As(err, &pe) {
			p.RetryAfter = max(pe.RetryAfter, p.RetryAfter)
		}
		if r.lastAnswer && errors.As(err, &pe) && pe.HTTPStatus != 0 {
			answer := fmt.Sprintf(" (the provider's last answer: HTTP %d", pe.HTTPStatus)
			if pe.Code != "" {
				answer += " " + pe.Code
			}
			p.Message += answer + ")"
			p.Page += answer + ")"
		}
		return p
	}
	return internal
}
