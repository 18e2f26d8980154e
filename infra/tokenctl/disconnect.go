package tokenctl

import (
	"context"
	"errors"
	"fmt"

	"github.com/tokenguard/tokenguard/domain"
)

// disconnect is tokenctl disconnect --connection NAME [--revoke].
func disconnect(ctx context.Context, store Store, name string, revoke bool, stdio IO, fail failFunc) int {
	t, err := store.Disconnect(ctx, name, revoke)
	switch {
	case errors.Is(err, domain.ErrNotFound):
		return fail(exitUsage, "disconnect: connection %q not found", name)
	case errors.Is(err, domain.ErrNoRevocationEndpoint), errors.Is(err, domain.ErrUnknownProvider):
		return fail(exitUsage, "disconnect: %v; configure the revocation endpoint, or disconnect without --revoke "+
			"(the grant then stays valid at the provider until it expires or is revoked there)", err)
	case err != nil && revoke:
		return fail(exitFailure, "disconnect: %v; the connection is kept so that its grant can still be revoked: "+
			"run it again, or disconnect without --revoke to delete it anyway", err)
	case err != nil:
		return fail(exitFailure, "disconnect: %v", err)
	}
	how := "its refresh token was not revoked at the provider"
	if revoke {
		how = "its refresh token was revoked at the provider"
	}
	fmt.Fprintf(stdio.Stdout, "disconnected %s (was %s at version %d): %s; every process drops its cached token\n",
		t.Connection, t.Status, t.Version, how)
	return exitOK
}
