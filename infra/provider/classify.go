package provider

import (
	"net/http"

	"github.com/tokenguard/tokenguard/domain"
)

// codes is the one table of token endpoint error codes and what each means
// for the grant (RFC 6749 §5.2, plus what real providers send). Any other
// code is reported as "unrecognized_error": codes end up in errors, logs
// and the stored status reason, and a hostile provider could put anything
// there, the credentials it was sent included.
//
// The code decides whatever the status (Slack sends errors with a 200),
// except for the statuses classify checks first. Only GrantDead rows can
// mark a connection needs_reauth, so each says the refresh token itself is
// dead; a profile's own words count only with that profile
// (Refresher.profileDead).
//
// invalid_request and invalid_scope are ClientRejected: both are about our
// request and the client's registration (tokenguard sends no scope on
// refresh), the refresh token was not redeemed, and GrantDead would force
// every user to consent again for what an operator fixes in configuration.
var codes = map[string]domain.ErrorClass{
	// RFC 6749 §5.2.
	"invalid_grant":          domain.GrantDead,
	"invalid_client":         domain.ClientRejected,
	"unauthorized_client":    domain.ClientRejected,
	"unsupported_grant_type": domain.ClientRejected,
	"invalid_scope":          domain.ClientRejected, // see above
	"invalid_request":        domain.ClientRejected, // see above
	// Common additions (RFC 6749 §4.1.2.1, RFC 6750 §3.1, RFC 8628 §3.5).
	"temporarily_unavailable": domain.Transient,
	"server_error":            domain.Transient,
	"slow_down":               domain.Transient,
	"access_denied":           domain.Transient, // not a token endpoint code; too vague to kill a grant on
	"invalid_token":           domain.Transient, // a resource server's code; says nothing about the refresh token
	// RFC 9449 §5, §8: the proof is checked before the grant is looked at.
	"invalid_dpop_proof": domain.ClientRejected,
	"use_dpop_nonce":     domain.Transient, // answered once with the nonce by dpop.TokenTransport
	// Non-standard codes that say the refresh token is dead.
	"invalid_refresh_token": domain.GrantDead, // Slack (token rotation), in an HTTP 200 body {"ok":false,...}
	"BAD_REFRESH_TOKEN":     domain.GrantDead, // HubSpot, in a 400 body's "status" field
}

// classify says what an error answer means: status, then code.
//
//	3xx, 404, 405                   EndpointMisconfigured (whatever the body)
//	5xx, 429                        Transient (whatever the body)
//	a code in the table             its row
//	401 without one                 ClientRejected
//	anything else                   Unclassified (other 4xx, HTML, non-JSON, unknown codes)
//
// Transport failures (no answer, timeouts) never get here: they are
// Transient. Unclassified answers are not retried within a call; the use
// case paces them per connection (see domain.Unclassified).
func classify(status int, code string) domain.ErrorClass {
	switch {
	case status >= 300 && status < 400, status == http.StatusNotFound, status == http.StatusMethodNotAllowed:
		return domain.EndpointMisconfigured
	case status >= 500, status == http.StatusTooManyRequests:
		return domain.Transient
	}
	if class, ok := codes[code]; ok {
		return class
	}
	if status == http.StatusUnauthorized {
		return domain.ClientRejected
	}
	return domain.Unclassified
}

// reportedCode is code as errors may show it.
func reportedCode(code string) string {
	if _, ok := codes[code]; code == "" || ok {
		return code
	}
	return "unrecognized_error"
}

// clientAuthFailed: the provider refused the client's authentication
// before it looked at the grant (invalid_client, or a 401), so the refresh
// token was not spent and the request may go again in the other style.
func clientAuthFailed(pe *domain.ProviderError) bool {
	return pe.Class == domain.ClientRejected && (pe.Code == "invalid_client" || pe.HTTPStatus == http.StatusUnauthorized)
}
