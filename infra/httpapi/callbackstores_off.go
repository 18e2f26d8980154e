//go:build !tokenguard_e2e_callbackstores

package httpapi

import "context"

// ControlBuild is false in every real build: the callback keeps the grant
// pending (see callbackstores_on.go).
const ControlBuild = false

func (s *Server) redeemAtCallback(_ context.Context, o outcome) outcome { return o }
