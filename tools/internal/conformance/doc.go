// Package conformance is the harness of tokenguard's conformance matrix: one
// scenario suite (conformance_test.go) run against several independent
// OAuth2 servers, each behind a Proxy that counts every token-endpoint
// answer (and the client that sent it) and can make the real server reject
// the client or answer 503 for a while. One scenario (twoproviders_test.go)
// runs each server as a stored provider beside a second server that is the
// OAUTH_* one, both refreshed by the same processes. Resource is a protected API that asks the server itself (token
// introspection, RFC 7662) whether an access token is still good, and
// Matrix renders the results as a markdown table.
//
// Test tooling only: no production binary links it.
package conformance
