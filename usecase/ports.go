// Package usecase holds tokenguard's application logic: hand out a valid
// access token for a connection, refreshing it at most once per expiry
// across every goroutine and process that shares the connection.
//
// It declares the ports it needs (a token store, a provider, a clock) and
// knows nothing of GORM, SQL or HTTP.
package usecase

import (
	"context"
	"errors"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// TokenStore is where tokens live, shared by every process.
type TokenStore interface {
	// Get reads a token without locking.
	Get(ctx context.Context, connection string) (domain.Token, error)
	// GetWithLease is Get, and reports what it knows of another holder's
	// refresh of the version read (its lease).
	GetWithLease(ctx context.Context, connection string) (domain.Token, Lease, error)
	// InLock runs fn in a transaction holding the connection's exclusive
	// refresh lock. ctx and wait bound the wait for the lock; after that fn
	// runs under the context it is given, bounded by hold and no longer
	// cancelled by ctx. A write (Save, Put) commits at once; otherwise
	// fn's error rolls back and nil commits.
	InLock(ctx context.Context, connection string, wait, hold time.Duration,
		fn func(ctx context.Context, s LockedStore) error) error
	// TryInLock is InLock if the connection's lock is free right now; it
	// reports false, fn not run, if another transaction holds it.
	TryInLock(ctx context.Context, connection string, hold time.Duration,
		fn func(ctx context.Context, s LockedStore) error) (bool, error)
	// ClaimInLock is TryInLock with a bid for the refresh lease of
	// bid.Version: where it can, the store takes the lease in the lock's
	// own round trip, with the re-read and the commit, if the stored token
	// is still at that version, not dead, has no failure on record and is
	// not leased by another holder. fn
	// runs as in TryInLock, on a transaction that has ended: Get returns
	// the re-read, and Lease of bid.Version hands out the lease taken, or
	// fails with domain.ErrRefreshInProgress (another holder's lease) or
	// ErrBidMissed (the caller looks again without a bid). A lease taken
	// for a caller whose fn does not ask for it is released. A store may
	// ignore the bid: Lease then takes the lease as in InLock.
	//
	// There is no bid with a wait for the lock: a lease queued behind a
	// lock wait would be taken when the lock comes, also for a caller
	// that gave up meanwhile (the server does not see a client go), and
	// it would hold the other callers off until it ran out.
	ClaimInLock(ctx context.Context, connection string, hold time.Duration, bid LeaseBid,
		fn func(ctx context.Context, s LockedStore) error) (bool, error)
	// SaveLocked is InLock with nothing in it but a LockedStore.Save of t
	// (one round trip where the store can): it fails with
	// domain.ErrConflict, having written nothing, when the stored version
	// is not t.Version.
	SaveLocked(ctx context.Context, wait time.Duration, t domain.Token) (domain.Token, error)
}

// Lease is what a read saw of the refresh lease on the version it read.
type Lease struct {
	// Running: another holder presented (or is about to present) the
	// version's refresh token and its answer is not in.
	Running bool
	// Age is how long ago the lease was taken, when there is one.
	Age time.Duration
	// Abandoned: the lease ran out with no answer stored or recorded (its
	// holder died or lost the database past the answer deadline). The
	// request it covered is unresolved for good: its answer is lost.
	Abandoned bool
}

// LeaseBid is the refresh lease a caller asks for with the lock
// (TokenStore.ClaimInLock).
type LeaseBid struct {
	Version int64         // the stored version the caller found due
	Call    time.Duration // the bound of the provider call, as for LockedStore.Lease
}

// ErrBidMissed is LockedStore.Lease's answer, in a transaction opened with
// a bid that was not won at the version asked, when no other holder's
// lease runs (the stored version moved, or a failure was on record): the
// transaction has ended, and the caller looks again without the bid.
var ErrBidMissed = errors.New("lease bid missed: the stored token was not the one bid for")

// LockedStore is the store bound to the locked transaction. Save, Put and
// Lease commit it: a token the provider rotated is durable as soon as it
// is written, whatever happens next, and the write is the transaction's
// last statement.
type LockedStore interface {
	// Get re-reads the token inside the lock.
	Get(ctx context.Context, connection string) (domain.Token, error)
	// Save writes t if the stored version is still t.Version, commits, and
	// returns the stored token with its new version.
	Save(ctx context.Context, t domain.Token) (domain.Token, error)
	// Put stores a newly granted token, replacing the connection's grant,
	// and commits.
	Put(ctx context.Context, t domain.Token) (domain.Token, error)
	// Lease records durably that t's refresh token is about to be
	// presented at the provider, and commits: the lock and its database
	// connection are let go, so that the provider call holds neither. The
	// record lives on until end is called: until then, the next holder's
	// Lease fails with domain.ErrRefreshInProgress, unless a newer version
	// was stored. A lease on the same version is never free by time: once
	// call (the answer deadline) and a second have passed since it was
	// taken and its holder stopped renewing it, it is abandoned
	// (Lease.Abandoned) and still refused until Fail records the lost
	// answer. Save ends it for everyone when it stores the rotated token;
	// end(true) deletes it and announces that, for a refresh whose token
	// was not spent.
	Lease(ctx context.Context, t domain.Token, call time.Duration) (end func(release bool), err error)
	// Fail records f as the refresh failure episode of t's version (every
	// process reads it with the token, domain.Token.Failure), ends t's
	// lease, announcing its release, and commits. It fails with
	// domain.ErrConflict when the stored version is not t.Version.
	Fail(ctx context.Context, t domain.Token, f domain.RefreshFailure) error
}

// ConnectionStore is what connecting a new grant needs on top of locking.
type ConnectionStore interface {
	// Register records a connection name so that it can be locked before
	// it has a token. Registering twice is harmless.
	Register(ctx context.Context, connection string) error
	InLock(ctx context.Context, connection string, wait, hold time.Duration,
		fn func(ctx context.Context, s LockedStore) error) error
}

// Refresher redeems a refresh token at a connection's provider.
type Refresher interface {
	// Refresh redeems refreshToken at provider (a stored provider's name;
	// "" is the provider of the process's configuration). It returns the
	// new grant, or an error that wraps domain.ErrGrantRevoked when
	// retrying cannot help, domain.ErrProviderUnavailable when it may, and
	// domain.ErrUnknownProvider (with domain.ErrEndpointMisconfigured)
	// when provider is not registered.
	Refresh(ctx context.Context, provider string, refreshToken domain.Secret) (domain.Grant, error)
}

// Clock tells the time; tests move it.
type Clock interface {
	Now() time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }
