//go:build tokenguard_e2e_callbackstores

package httpapi

import (
	"context"

	"github.com/tokenguard/tokenguard/infra/httpapi/problem"
)

// storeAtCallback: this build is the e2e tests' control, without the
// redeem step and the public limits. Never built for use.
const storeAtCallback = true

// ControlBuild tells di to wire the control build (see storeAtCallback).
const ControlBuild = true

// redeemAtCallback redeems the pending result at once, with no backend.
func (s *Server) redeemAtCallback(ctx context.Context, o outcome) outcome {
	c, err := s.deps.Flows.RedeemFor(ctx, o.result, nil)
	if err != nil {
		return outcome{Code: problem.Of(err).Code}
	}
	s.redeemed(ctx, c)
	return outcome{Code: "connected", Connected: true}
}
