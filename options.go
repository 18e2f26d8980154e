package tokenguard

import (
	"crypto"
	"log/slog"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tokenguard/tokenguard/domain"
)

// Option configures New.
type Option func(*options)

type options struct {
	revocationURL                  string
	skew, lockWait, refreshTimeout time.Duration
	answerDeadline                 time.Duration
	log                            *slog.Logger
	keys                           string
	encryptionRequired             bool
	onNeedsReauth                  func(connection, reason string)
	metrics                        func(ConnectionCounter, bool, *slog.Logger) Metrics
	connectionLabel                bool
	httpClient                     *http.Client
	listenDSN                      string
	cacheSize                      int
	maxRefreshesInFlight           int
	defaultLifetime                time.Duration
	profile                        string
	profileParams                  map[string]string
	syncCommit                     string
	userInfo                       userInfo
	tracerProvider                 trace.TracerProvider
	dpop                           bool // the configuration's provider requires DPoP
	clientKey                      crypto.Signer
	resource                       string
	par                            domain.PARMode
	tokenRate                      string // the configuration's provider's token budget, N/PERIOD
}

// userInfo is where Complete asks which account consented.
type userInfo struct{ url, field string }

// WithSkew refreshes a token once it is within d of its expiry (default
// 30s), capped at half the lifetime the provider granted.
func WithSkew(d time.Duration) Option { return func(o *options) { o.skew = d } }

// WithLockWait bounds the wait for another process's refresh of the same
// connection (default 15s); past it Token fails with ErrLockTimeout.
func WithLockWait(d time.Duration) Option { return func(o *options) { o.lockWait = d } }

// WithRefreshTimeout bounds one refresh at the provider, retries included
// (default 10s, and at most two thirds of the lock wait). It must be
// shorter than the lock wait, so that a process waiting behind a refresh
// outlasts it and then finds the new token.
func WithRefreshTimeout(d time.Duration) Option {
	return func(o *options) { o.refreshTimeout = d }
}

// WithAnswerDeadline bounds how long the answer to a request that
// presented a refresh token is awaited (default 2m, at least the refresh
// timeout). Callers stop waiting after the refresh timeout; until the
// answer is in or the deadline passes no process presents that refresh
// token again: a provider that hangs answers its queue when it resumes,
// and a strict one revokes a grant whose refresh token it sees twice. Set
// it above the longest hang you expect of the provider.
func WithAnswerDeadline(d time.Duration) Option {
	return func(o *options) { o.answerDeadline = d }
}

// WithLogger receives what operators must know: refreshes, the cache
// state, a grant found dead. Never a token. Default slog.Default().
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithEncryptionKeys stores tokens encrypted with AES-256-GCM. spec is
// "id=base64key*,id=base64key" (ids of 1-32 [a-z0-9_-], 32-byte keys, the
// current one marked '*'). New fails if a stored token cannot be
// decrypted. Without it, tokens are stored as they are.
func WithEncryptionKeys(spec string) Option { return func(o *options) { o.keys = spec } }

// WithEncryptionRequired refuses plaintext stored tokens: New fails while
// any row is plaintext. Turn it on once tokenctl rotate-key has sealed
// every row. It needs WithEncryptionKeys.
func WithEncryptionRequired() Option { return func(o *options) { o.encryptionRequired = true } }

// WithNeedsReauth is called once, by the process that found out, when a
// connection's grant is rejected for good: a person must connect it again
// (Import a new grant). reason is the provider's OAuth2 error code.
func WithNeedsReauth(fn func(connection, reason string)) Option {
	return func(o *options) { o.onNeedsReauth = fn }
}

// WithMetricsPerConnection adds a "connection" label to the refresh
// counters of prom.WithMetrics. Only for a small fleet: it makes a series
// per connection.
func WithMetricsPerConnection() Option { return func(o *options) { o.connectionLabel = true } }

// WithHTTPClient is the client for the provider's token endpoint. Bound
// its timeout: the connection's refresh lease is held meanwhile. It never
// follows a redirect, whatever its CheckRedirect, and its transport is
// wrapped in otelhttp's. Default: every phase bounded by the refresh
// timeout.
func WithHTTPClient(c *http.Client) Option { return func(o *options) { o.httpClient = c } }

// WithListenDSN is the database Run listens on (one connection outside
// the pool), for a *gorm.DB opened from an *sql.DB whose DSN New cannot
// see (without it New returns ErrCannotListen). Default: the DSN the
// *gorm.DB was opened with, or OpenPool's pool's configuration.
func WithListenDSN(dsn string) Option { return func(o *options) { o.listenDSN = dsn } }

// WithCacheSize bounds how many connections this process keeps a token of
// (default 10,000, about 0.5 KB each); the least recently used are read
// again when asked for. Negative: no bound.
func WithCacheSize(n int) Option { return func(o *options) { o.cacheSize = n } }

// WithMaxRefreshesInFlight bounds how many refreshes this process runs at
// once (default 64); a refresh holds no database connection while the
// provider answers. Callers beyond it queue in order of arrival, and the
// queue does not count against the lock wait.
func WithMaxRefreshesInFlight(n int) Option { return func(o *options) { o.maxRefreshesInFlight = n } }

// WithDefaultLifetime is the lifetime of an access token whose token
// endpoint answer has no usable expires_in (default none: such a token is
// used until the API answers 401, then refreshed).
func WithDefaultLifetime(d time.Duration) Option { return func(o *options) { o.defaultLifetime = d } }

// WithRevocationURL is the provider's revocation endpoint (RFC 7009) for
// Disconnect with revoke, which without it fails with
// ErrNoRevocationEndpoint.
func WithRevocationURL(url string) Option { return func(o *options) { o.revocationURL = url } }

// WithUserInfo is where Complete asks which account consented when the
// token answer has no ID token: idField ("" is "sub") names it.
func WithUserInfo(url, idField string) Option {
	return func(o *options) { o.userInfo = userInfo{url: url, field: idField} }
}

// WithSyncCommit is the synchronous_commit level of the transactions that
// store a rotated refresh token or claim a refresh (else
// ErrInvalidSyncCommit). Default: remote_apply while the primary has a
// synchronous standby (a success means the standby has the token), else on.
func WithSyncCommit(level string) Option { return func(o *options) { o.syncCommit = level } }

// WithTracerProvider records tokenguard's spans on tp: every step of a
// Token call the cache did not answer (a cache hit records nothing), and
// sweeps. Spans never carry a token, secret, code or account id. Default:
// the global provider.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) { o.tracerProvider = tp }
}

// WithTokenRate sets a token budget for the provider of cfg that every
// process of the deployment respects together: at most N token requests
// in any PERIOD ("20/1s", "100/1m", "10/10m"; OAUTH_TOKEN_RATE for the
// bundled apps). Each process must be given the same. Refreshes beyond it
// wait, in expiry order, while still-valid tokens are served; the
// proactive sweep spends only what callers leave; a 429 with Retry-After
// spends the rest of the budget for that long. New fails with an error
// wrapping ErrInvalidTokenRate when rate is malformed. Stored providers
// carry their own (tokenctl provider add/update --token-rate).
func WithTokenRate(rate string) Option { return func(o *options) { o.tokenRate = rate } }
