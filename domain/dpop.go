package domain

import "errors"

// ErrSenderConstrained: the connection's grant is bound to a DPoP key
// (RFC 9449), so its access token alone is useless to the caller: calls go
// through tokenguard's client or proxy, which sign a proof for each, or
// ask for a proof of one request (POST /connections/{name}/dpop-proof).
var ErrSenderConstrained = errors.New("connection is sender-constrained (DPoP): its access token is useless without a proof; call through tokenguard's client or proxy, or ask for a proof (POST /connections/{name}/dpop-proof)")
