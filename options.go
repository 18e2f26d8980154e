package tokenguard

import (
	"crypto"
	"log/slog"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/usecase"
)

// Option configures New.
type Option func(*options)

type options struct {
	usecase.Options // what the options set; New adds the rest

	defaultLifetime                                time.Duration
	revocationURL, listenDSN, syncCommit, resource string
	keys, profile                                  string
	encryptionRequired                             bool
	metrics                                        func(ConnectionCounter, bool, *slog.Logger) Metrics
	connectionLabel                                bool
	httpClient                                     *http.Client
	profileParams                                  map[string]string
	userInfo                                       provider.AccountSource // where Complete asks which account consented; New sets HTTP
	tracerProvider                                 trace.TracerProvider
	dpop                                           bool // cfg's provider requires DPoP
	clientKey                                      crypto.Signer
	par                                            domain.PARMode
	tokenRate                                      string // cfg's provider's token budget, N/PERIOD
}

// WithSkew refreshes a token once it is within d of its expiry (default
// 30s), capped at half the lifetime the provider granted.
func WithSkew(d time.Duration) Option { return func(o *options) { o.Skew = d } }

// WithLockWait bounds the wait for another process's refresh of the same
// connection (default 15s); past it Token fails with ErrLockTimeout.
func WithLockWait(d time.Duration) Option { return func(o *options) { o.LockWait = d } }

// WithRefreshTimeout bounds one refresh at the provider, retries included (default 10s,
// at most two thirds of the lock wait), so that a process waiting behind it finds the new token.
func WithRefreshTimeout(d time.Duration) Option { return func(o *options) { o.RefreshTimeout = d } }

// WithAnswerDeadline bounds the wait for the answer to a request that presented
// a refresh token (default 2m), during which no process presents it again: set it
// above the provider's longest hang, as a strict provider revokes a token seen twice.
func WithAnswerDeadline(d time.Duration) Option { return func(o *options) { o.AnswerDeadline = d } }

// WithLogger receives what operators must know: refreshes, the cache
// state, a grant found dead. Never a token. Default slog.Default().
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.Logger = l } }

// WithEncryptionKeys stores tokens encrypted with AES-256-GCM. spec is
// "id=base64key*,id=base64key" (32-byte keys, the current one marked '*').
func WithEncryptionKeys(spec string) Option { return func(o *options) { o.keys = spec } }

// WithEncryptionRequired makes New fail while any stored token is
// plaintext (tokenctl rotate-key seals them). It needs WithEncryptionKeys.
func WithEncryptionRequired() Option { return func(o *options) { o.encryptionRequired = true } }

// WithNeedsReauth calls fn once, in the process that found out, when a
// connection's grant is rejected for good; reason is the provider's code.
func WithNeedsReauth(fn func(connection, reason string)) Option {
	return func(o *options) { o.OnNeedsReauth = fn }
}

// WithMetricsPerConnection adds a "connection" label to the refresh
// counters of prom.WithMetrics: a series per connection, for small fleets.
func WithMetricsPerConnection() Option { return func(o *options) { o.connectionLabel = true } }

// WithHTTPClient is the client for the provider's token endpoint; bound its
// timeout, as the refresh lease is held meanwhile. It never follows a redirect.
func WithHTTPClient(c *http.Client) Option { return func(o *options) { o.httpClient = c } }

// WithListenDSN is the database Run listens on, for a *gorm.DB opened from
// an *sql.DB whose DSN New cannot see (else ErrCannotListen).
func WithListenDSN(dsn string) Option { return func(o *options) { o.listenDSN = dsn } }

// WithCacheSize bounds how many connections' tokens this process caches
// (default 10,000, about 0.5 KB each; negative: no bound).
func WithCacheSize(n int) Option { return func(o *options) { o.CacheSize = n } }

// WithMaxRefreshesInFlight bounds this process's concurrent refreshes
// (default 64). Callers beyond it queue, not counted against the lock wait.
func WithMaxRefreshesInFlight(n int) Option { return func(o *options) { o.MaxRefreshesInFlight = n } }

// WithDefaultLifetime is the lifetime of an access token whose answer has
// no usable expires_in (default none: it is used until the API answers 401).
func WithDefaultLifetime(d time.Duration) Option { return func(o *options) { o.defaultLifetime = d } }

// WithRevocationURL is the provider's revocation endpoint (RFC 7009) for
// Disconnect with revoke (else ErrNoRevocationEndpoint).
func WithRevocationURL(url string) Option { return func(o *options) { o.revocationURL = url } }

// WithUserInfo is where Complete asks which account consented when the
// token answer has no ID token: idField ("" is "sub") names it.
func WithUserInfo(url, idField string) Option {
	return func(o *options) { o.userInfo = provider.AccountSource{UserInfoURL: url, IDField: idField} }
}

// WithSyncCommit is the synchronous_commit level of the transactions that store a
// rotated refresh token (default: remote_apply with a synchronous standby, else on).
func WithSyncCommit(level string) Option { return func(o *options) { o.syncCommit = level } }

// WithTracerProvider records tokenguard's spans on tp instead of the global
// provider. Spans never carry a token, secret, code or account id.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) { o.tracerProvider = tp }
}

// WithTokenRate sets the deployment-wide token budget of cfg's provider, N token
// requests per PERIOD ("20/1s"); give every process the same (else ErrInvalidTokenRate).
func WithTokenRate(rate string) Option { return func(o *options) { o.tokenRate = rate } }
