//go:build tokenguard_e2e_callbackstores

package httpapi

import (
	"context"

	"github.com/tokenguard/tokenguard/infra/httpapi/problem"
)

// ControlBuild: this build is the e2e tests' control, without the redeem
// step and the public limits, and di wires it so. Never built for use.
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
