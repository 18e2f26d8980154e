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
	// ErrNeedsReauth: the provider rejected the connection's grant for
	// good; a person must connect it again (Import a new grant).
	ErrNeedsReauth = domain.ErrNeedsReauth
	// ErrLockTimeout: another process's refresh of the connection took
	// longer than the lock wait.
	ErrLockTimeout = domain.ErrLockTimeout
	// ErrProviderUnavailable: the provider could not refresh right now
	// (5xx, 429, timeout, network); the stored token is untouched.
	ErrProviderUnavailable = domain.ErrProviderUnavailable
	// ErrClientRejected: the token endpoint rejected the client
	// registration (client id, secret or auth style): fix the
	// oauth2.Config; the grant is fine and was not spent.
	ErrClientRejected = domain.ErrClientRejected
	// ErrEndpointMisconfigured: the token endpoint URL does not answer as
	// one.
	ErrEndpointMisconfigured = domain.ErrEndpointMisconfigured
	// ErrStoreUnavailable: the database failed.
	ErrStoreUnavailable = domain.ErrStoreUnavailable
	// ErrReadOnlyStore: New was given a replica (a server in recovery);
	// every refresh must be written to the primary.
	ErrReadOnlyStore = domain.ErrReadOnlyStore
	// ErrUndecryptable: a stored token cannot be decrypted with the
	// configured keys (WithEncryptionKeys); it is never sent anywhere.
	ErrUndecryptable = domain.ErrUndecryptable
	// ErrRefreshRateLimited: the API answered 401 again right after a
	// forced refresh of the connection; Client gives the 401 back.
	ErrRefreshRateLimited = domain.ErrRefreshRateLimited
	// ErrRefreshFailing: the connection's refreshes keep failing with
	// answers tokenguard cannot classify, and the provider is asked again
	// only later (at most once a minute); it comes with
	// ErrProviderUnavailable. The grant is untouched.
	ErrRefreshFailing = domain.ErrRefreshFailing
	// ErrInvalidToken: Import was given a token without an access or a
	// refresh token.
	ErrInvalidToken = domain.ErrInvalidToken
	// ErrInvalidConnection: the connection name is not 1-128 characters
	// of [A-Za-z0-9._-] starting with a letter or digit.
	ErrInvalidConnection = domain.ErrInvalidConnection
	// ErrInvalidMetadata: WithMetadata was given something other than a
	// JSON object of at most 16 KiB, or more than 32 tags, or a malformed
	// tag. Nothing was stored.
	ErrInvalidMetadata = domain.ErrInvalidMetadata
	// ErrUnknownProvider: WithProvider names a provider that is not stored
	// (tokenctl provider add). Nothing was stored.
	ErrUnknownProvider = domain.ErrUnknownProvider
	// ErrUnknownProfile: WithProfile names no provider profile (tokenctl
	// provider profiles lists them).
	ErrUnknownProfile = domain.ErrUnknownProfile
	// ErrNoRevocationEndpoint: Disconnect was asked to revoke, and no
	// revocation endpoint is configured (WithRevocationURL). Nothing was
	// changed.
	ErrNoRevocationEndpoint = domain.ErrNoRevocationEndpoint
	// ErrInvalidSyncCommit: WithSyncCommit was given a level other than
	// off, local, remote_write, on or remote_apply.
	ErrInvalidSyncCommit = domain.ErrInvalidSyncCommit
	// ErrSchemaNotFound: Migrate or New was given a pool whose search_path
	// names a schema that does not exist (the message names it): create
	// it, or fix the search_path. tokenguard's tables never fall through
	// to another schema of the path.
	ErrSchemaNotFound = domain.ErrSchemaNotFound
	// ErrResultInvalid: Redeem was given a connect result code that is
	// unknown, expired or already redeemed. Nothing was stored.
	ErrResultInvalid = domain.ErrResultInvalid
	// ErrAccountMismatch: Redeem's grant is from another provider account
	// than the connection's, and its flow did not allow the change.
	// Nothing was stored.
	ErrAccountMismatch = domain.ErrAccountMismatch
	// ErrClosed: Close was called.
	ErrClosed = errors.New("tokenguard: closed")
)
