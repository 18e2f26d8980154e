// Package usecaseof hands the bundled apps (di) the use case under a
// *tokenguard.Tokens, for what the public API leaves out: the batch's
// refresh ahead of expiry. The root package sets Tokens when it loads.
package usecaseof

import "github.com/tokenguard/tokenguard/usecase"

// Tokens returns the use case of a *tokenguard.Tokens.
var Tokens func(tokens any) *usecase.RefreshTokenUseCase
