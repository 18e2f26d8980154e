package tokenctl

import (
	"context"
	"errors"
	"fmt"

	"github.com/tokenguard/tokenguard/domain"
)

// reactivatePage is how many connections --all-with-reason reads per query.
const reactivatePage = 100

// reactivateAll is tokenctl reactivate --all-with-reason REASON, a page at a time, each under its own
// lock. A connection whose lock stays taken is skipped, and the exit status says so; any other error stops.
func reactivateAll(ctx context.Context, store Store, reason string, stdio IO, fail failFunc) int {
	done, skipped := 0, 0
	for after := ""; ; {
		page, err := store.NeedingReauth(ctx, reason, after, reactivatePage)
		if err != nil {
			return fail(exitFailure, "reactivate: %v", err)
		}
		if len(page) == 0 {
			break
		}
		for _, name := range page {
			after = name
			found, version, err := store.Reactivate(ctx, name, reason)
			switch {
			case errors.Is(err, domain.ErrLockTimeout):
				fmt.Fprintf(stdio.Stderr, "tokenctl: reactivate: %s: %v; skipped\n", name, err)
				skipped++
				continue
			case err != nil:
				return fail(exitFailure, "reactivate: %s: %v (%d reactivated before it)", name, err, done)
			}
			if version != 0 {
				done++
			}
			fmt.Fprintln(stdio.Stdout, reactivated(found, version))
		}
	}
	fmt.Fprintf(stdio.Stdout, "reactivated %d connection(s) marked needs_reauth for %s\n", done, reason)
	if skipped > 0 {
		return fail(exitFailure, "reactivate: %d connection(s) skipped: their lock stayed taken; run it again", skipped)
	}
	return exitOK
}

// reactivated is the one line per connection: name, old reason, version.
func reactivated(found domain.Token, version int64) string {
	switch {
	case version != 0:
		return fmt.Sprintf("reactivated connection %s: was needs_reauth (%s), now active at version %d; the next refresh decides",
			found.Connection, found.StatusReason, version)
	case found.Status == domain.StatusActive:
		return fmt.Sprintf("connection %s is already active (version %d): left alone", found.Connection, found.Version)
	}
	return fmt.Sprintf("connection %s now needs re-authorisation for %s (version %d): left alone",
		found.Connection, found.StatusReason, found.Version)
}

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
