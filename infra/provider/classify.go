package provider

import (
	"net/http"

	"github.com/tokenguard/tokenguard/domain"
)

// codes is what each token endpoint error code means for the grant. Any other
// code is reported as "unrecognized_error": a hostile provider could put
// anything in it, the credentials it was sent included. Only GrantDead rows
// can mark a connection needs_reauth, so each says the refresh token is dead.
// invalid_request and invalid_scope are about our request or registration.
var codes = map[string]domain.ErrorClass{
	// RFC 6749 §5.2.
	"invalid_grant":          domain.GrantDead,
	"invalid_client":         domain.ClientRejected,
	"unauthorized_client":    domain.ClientRejected,
	"unsupported_grant_type": domain.ClientRejected,
	"invalid_scope":          domain.ClientRejected,
	"invalid_request":        domain.ClientRejected,
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

// classify says what an error answer means: 3xx, 404, 405 are
// EndpointMisconfigured and 5xx, 429 Transient whatever the body; then the
// code's row; then a 401 is ClientRejected; anything else Unclassified.
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

// clientAuthFailed: the client was refused before the grant was looked at,
// so the refresh token was not spent.
func clientAuthFailed(pe *domain.ProviderError) bool {
	return pe.Class == domain.ClientRejected && (pe.Code == "invalid_client" || pe.HTTPStatus == http.StatusUnauthorized)
}
