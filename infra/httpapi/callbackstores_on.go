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
		p := problem.Of(err)
		return outcome{httpStatus: p.Status, Connection: o.Connection, Code: p.Code, Message: "The grant could not be stored."}
	}
	s.redeemed(ctx, c)
	return outcome{httpStatus: 200, Connection: o.Connection, Code: "connected", Connected: true}
}
