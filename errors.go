package tokenguard

import (
	"errors"

	"github.com/tokenguard/tokenguard/domain"
)

// Every error of Token, Client, TokenSource and Import wraps one of these
// (or the context's error); match them with errors.Is.
var (
	// ErrNotFound: no connection of that name has a token.
	ErrNotFound = domain.ErrNotFound
	// ErrNeedsReauth: the provider rejected the grant for good.
	ErrNeedsReauth = domain.ErrNeedsReauth
	// ErrLockTimeout: another process's refresh outlasted the lock wait.
	ErrLockTimeout = domain.ErrLockTimeout
	// ErrProviderUnavailable: the provider could not refresh now; the stored token is untouched.
	ErrProviderUnavailable = domain.ErrProviderUnavailable
	// ErrClientRejected: the token endpoint rejected the client; the grant was not spent.
	ErrClientRejected = domain.ErrClientRejected
	// ErrEndpointMisconfigured: the token URL does not answer as one.
	ErrEndpointMisconfigured = domain.ErrEndpointMisconfigured
	// ErrStoreUnavailable: the database failed.
	ErrStoreUnavailable = domain.ErrStoreUnavailable
	// ErrReadOnlyStore: New was given a replica; refreshes must be written to the primary.
	ErrReadOnlyStore = domain.ErrReadOnlyStore
	// ErrUndecryptable: a stored token cannot be decrypted with the keys; it is never sent anywhere.
	ErrUndecryptable = domain.ErrUndecryptable
	// ErrRefreshRateLimited: the API answered 401 again right after a forced refresh.
	ErrRefreshRateLimited = domain.ErrRefreshRateLimited
	// ErrRefreshFailing (with ErrProviderUnavailable): the refreshes keep getting unclassifiable answers.
	ErrRefreshFailing = domain.ErrRefreshFailing
	// ErrInvalidToken: Import's token lacks an access or a refresh token.
	ErrInvalidToken = domain.ErrInvalidToken
	// ErrInvalidConnection: the name is not 1-128 of [A-Za-z0-9._-] starting with a letter or digit.
	ErrInvalidConnection = domain.ErrInvalidConnection
	// ErrInvalidMetadata: WithMetadata's object or tags break its limits.
	ErrInvalidMetadata = domain.ErrInvalidMetadata
	// ErrUnknownProvider: WithProvider names a provider not stored.
	ErrUnknownProvider = domain.ErrUnknownProvider
	// ErrUnknownProfile: WithProfile names no provider profile.
	ErrUnknownProfile = domain.ErrUnknownProfile
	// ErrNoRevocationEndpoint: Disconnect cannot revoke (WithRevocationURL); nothing changed.
	ErrNoRevocationEndpoint = domain.ErrNoRevocationEndpoint
	// ErrInvalidSyncCommit: WithSyncCommit's level is not a synchronous_commit level.
	ErrInvalidSyncCommit = domain.ErrInvalidSyncCommit
	// ErrInvalidTokenRate: WithTokenRate's budget is not N/PERIOD.
	ErrInvalidTokenRate = domain.ErrInvalidTokenRate
	// ErrTokenBudgetSpent: the token budget (WithTokenRate) is spent and the token expired meanwhile.
	ErrTokenBudgetSpent = domain.ErrTokenBudgetSpent
	// ErrSchemaNotFound: the search_path names a missing schema; tables never fall through to another.
	ErrSchemaNotFound = domain.ErrSchemaNotFound
	// ErrResultInvalid: Redeem's code is unknown, expired or used.
	ErrResultInvalid = domain.ErrResultInvalid
	// ErrAccountMismatch: Redeem's grant is from another account, and its flow did not allow it.
	ErrAccountMismatch = domain.ErrAccountMismatch
	// ErrClosed: Close was called.
	ErrClosed = errors.New("tokenguard: closed")
	// ErrCannotListen: New was given a *gorm.DB whose database Run cannot see to listen on.
	ErrCannotListen = errors.New("tokenguard: Run could not listen on this *gorm.DB's database: open it with tokenguard.OpenPool(pool) or postgres.Open(dsn), or pass WithListenDSN")
)
