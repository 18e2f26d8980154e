// Package usecase hands out a valid access token for a connection, refreshing it at most
// once per expiry across every process that shares it. It knows nothing of SQL or HTTP.
package usecase

import (
	"context"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// TokenStore is where tokens live, shared by every process. Read takes no lock; Claim, Store
// and Fail are each one short transaction under the connection's advisory lock, committed
// before they return. ctx bounds the wait for the lock (domain.ErrLockTimeout); once held,
// the transaction runs to its end whatever ctx does.
type TokenStore interface {
	// Read reads connection's token and the lease on its version, if any.
	Read(ctx context.Context, connection string) (domain.Token, Lease, error)
	// Claim leases the refresh of seen for answerWithin if, re-read under the lock, the token is
	// still seen (version and failure record), active, and no other holder's request is unresolved.
	Claim(ctx context.Context, seen domain.Token, answerWithin time.Duration) (Claim, error)
	// Store writes t if the stored version is still t.Version, ending the leases of older versions
	// and announcing the new version; otherwise it writes nothing and fails with domain.ErrConflict.
	Store(ctx context.Context, t domain.Token) (domain.Token, error)
	// Fail records f as the failure episode of t's version, ends its lease and announces that;
	// domain.ErrConflict, writing nothing, when the stored version is not t.Version.
	Fail(ctx context.Context, t domain.Token, f domain.RefreshFailure) error
}

// Lease is what a read saw of the refresh lease on the version it read.
type Lease struct {
	// Running: another holder presented (or is about to) the version's refresh token; no answer yet.
	Running bool
	Age     time.Duration // since the lease was taken
	// Abandoned: the lease ran out with no answer stored or recorded; its answer is lost for
	// good. A lease is never free by time.
	Abandoned bool
}

// Claim is what TokenStore.Claim found, and the lease it took.
type Claim struct {
	Token domain.Token // as re-read under the lock
	Lease Lease        // another holder's lease on Token's version
	// End ends the lease taken; nil when none was. With release the refresh token was not spent:
	// the lease is deleted and its end announced. Without, Store or Fail ended it: no more renewal.
	End func(release bool)
	// Why, when the store keeps a history, notes why the refresh ends without a stored token,
	// before End(true) or Fail; nil otherwise.
	Why func(reason string)
	// BudgetWait: no lease, the provider's token budget is spent for about this long.
	BudgetWait time.Duration
}

type spareBudgetKey struct{}

// SpareBudget marks ctx's claims as the proactive sweep's, which leave callers a budget reserve.
func SpareBudget(ctx context.Context) context.Context {
	return context.WithValue(ctx, spareBudgetKey{}, true)
}

// SpareBudgetOnly reports whether ctx was marked by SpareBudget.
func SpareBudgetOnly(ctx context.Context) bool {
	return ctx.Value(spareBudgetKey{}) != nil
}

// BudgetShrinker is a TokenStore whose token budgets a 429 with Retry-After shrinks, fleet-wide.
type BudgetShrinker interface {
	// ShrinkBudget spends provider's budget for d from now; false if provider has none.
	ShrinkBudget(ctx context.Context, provider string, d time.Duration) (bool, error)
}

// LockedStore is the store bound to a transaction holding a connection's lock (ConnectionStore.InLock).
type LockedStore interface {
	// Get re-reads the token inside the lock.
	Get(ctx context.Context, connection string) (domain.Token, error)
	// Put stores a newly granted token, replacing the connection's grant.
	Put(ctx context.Context, t domain.Token) (domain.Token, error)
	// SpendResult spends a connect result in its grant's transaction; domain.ErrResultInvalid if spent or expired.
	SpendResult(ctx context.Context, id int64) error
	// SetMetadata replaces the connection's metadata and tags.
	SetMetadata(ctx context.Context, connection string, m domain.Metadata) error
	// SetProviderFields replaces the "provider_fields" object of the connection's metadata, only.
	SetProviderFields(ctx context.Context, connection string, fields map[string]string) error
}

// ConnectionStore is what connecting a new grant needs on top of locking.
type ConnectionStore interface {
	// Register records a name so that it can be locked before it has a token; idempotent.
	Register(ctx context.Context, connection string) error
	// InLock runs fn in a transaction holding the connection's lock, waiting at most wait for it;
	// fn's context is bounded by hold, no longer cancelled by ctx. fn's error rolls back; nil commits.
	InLock(ctx context.Context, connection string, wait, hold time.Duration,
		fn func(ctx context.Context, s LockedStore) error) error
}

// Refresher redeems a refresh token at a connection's provider.
type Refresher interface {
	// Refresh redeems refreshToken at provider ("" is the process's configured one). Errors wrap
	// domain.ErrGrantRevoked when retrying cannot help, domain.ErrProviderUnavailable when it may,
	// and domain.ErrUnknownProvider (with domain.ErrEndpointMisconfigured) when provider is unknown.
	Refresh(ctx context.Context, provider string, refreshToken domain.Secret) (domain.Grant, error)
}

// Clock tells the time; tests move it.
type Clock interface {
	Now() time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }
