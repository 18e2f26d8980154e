// Package usecaseof hands the bundled apps (di) the use case under a
// *tokenguard.Tokens, for what the public API leaves out: the batch's
// refresh ahead of expiry, and the stored providers (a connection's API
// base URL). The root package sets Tokens and Providers when it loads.
package usecaseof

import (
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/usecase"
)

// Tokens returns the use case of a *tokenguard.Tokens.
var Tokens func(tokens any) *usecase.RefreshTokenUseCase

// Providers returns the provider registry of a *tokenguard.Tokens.
var Providers func(tokens any) *provider.Registry
