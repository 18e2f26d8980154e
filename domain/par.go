package domain

import "errors"

// PARMode says when the connect flow pushes its authorization request (RFC 9126) instead of sending it in the URL.
type PARMode string

const (
	// PARAuto pushes when the provider's metadata or profile requires it.
	PARAuto PARMode = "auto"
	// PARAlways always pushes, failing the flow when the provider advertises no endpoint.
	PARAlways PARMode = "always"
	PARNever  PARMode = "never"
)

// ParsePARMode reads "auto" (or ""), "always" or "never". Errors wrap ErrInvalidProvider.
func ParsePARMode(s string) (PARMode, error) {
	return parseChoice(s, "par must be auto, always or never", PARAuto, PARAlways, PARNever)
}

// ErrNoPAREndpoint: pushed requests are required and the provider's endpoint for them is unknown.
var ErrNoPAREndpoint = errors.New("the provider's metadata names no pushed_authorization_request_endpoint")

// AssertionAudience is the aud of the private_key_jwt client assertions (RFC 7523 §3) a provider accepts.
type AssertionAudience string

const (
	AudienceTokenEndpoint AssertionAudience = "token_endpoint" // the default
	AudienceIssuer        AssertionAudience = "issuer"         // the issuer identifier of its metadata
)
