// Package sandbox is a strict, in-process OAuth2 authorization server for
// tests and demos of tokenguard. It is built on github.com/ory/fosite (memory
// store, HMAC tokens) and behaves like the providers tokenguard has to cope
// with:
//
//   - Refresh tokens rotate: every successful refresh_token grant returns a new
//     refresh token, and the presented one can never be used again.
//   - A refresh revokes the access token previously issued for the grant; it
//     answers 401 at /resource at once, even though it has not expired.
//   - Presenting a refresh token that was already rotated away is answered
//     with 400 invalid_grant and counted in Stats.RefreshReuse. Following
//     RFC 9700 §4.14.2, fosite then also revokes the whole grant: the newest
//     refresh token and access token of that grant die too, so a client that
//     lost a refresh race finds out loudly instead of silently.
//   - Refresh-grant requests are serialised per Provider, so two concurrent
//     requests presenting the same refresh token can never both succeed.
//   - Access tokens expire exactly after Options.AccessTokenLifespan (fosite
//     itself would round expiry to whole seconds; the sandbox does not).
//
// The revocation endpoint (RFC 7009, POST /oauth2/revoke) authenticates
// the client as the token endpoint does and revokes the whole grant of the
// token it is given: a revoked refresh token is then answered
// invalid_grant (not counted as reuse) and the grant's access token 401.
//
// The authorization endpoint auto-approves: it grants every requested (and
// allowed) scope to the subject "sandbox-user" and redirects with a code.
// A test plays another person with login_hint=SUBJECT and a narrower
// consent with consent_scope="a b" on the authorization request;
// GET /userinfo tells who a token's subject is.
// Refresh tokens are issued on every code exchange; the client does not have
// to ask for "offline" or "offline_access" (fosite would require one of them
// by default, the sandbox configures fosite's RefreshTokenScopes to be empty).
// Both scopes are still accepted, for clients configured for providers that
// need them.
//
// Token values are never logged and never appear in errors or statistics.
package sandbox

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ory/fosite"
	"github.com/ory/fosite/compose"
	fositeoauth2 "github.com/ory/fosite/handler/oauth2"
	"github.com/ory/fosite/storage"
	"golang.org/x/oauth2"
	"golang.org/x/time/rate"
)

// Subject is the resource owner the authorization endpoint approves for.
const Subject = "sandbox-user"

// Fault is a failure the token endpoint can inject into a refresh_token grant.
// A faulted request never reaches the store: nothing is rotated or revoked.
type Fault int

const (
	FaultNone Fault = iota
	// FaultUnavailable answers 503 {"error":"temporarily_unavailable"}.
	FaultUnavailable
	// FaultTooManyRequests answers 429 with Retry-After: 1 and
	// {"error":"temporarily_unavailable"}.
	FaultTooManyRequests
	// FaultHang blocks until the client gives up (its request context is
	// done), so the client sees a timeout. As a safety net against clients
	// without a timeout it stops waiting after maxHang.
	FaultHang
	// FaultInvalidGrant answers 400 {"error":"invalid_grant"} without
	// consulting the store; the refresh token stays valid.
	FaultInvalidGrant
	// FaultInvalidClient answers 401 {"error":"invalid_client"}, what a
	// provider says while a rotated client secret has not reached the apps
	// yet. The refresh token is not looked at and stays valid.
	FaultInvalidClient
	// FaultLostAnswer processes the refresh in full (the presented refresh
	// token is rotated away, the old access token revoked), then closes
	// the connection without answering: the client never learns the new
	// tokens. Unlike the other faults, the request reaches the store.
	FaultLostAnswer
	// FaultUnknownCode answers 400 {"error":"account_under_review"}, a
	// code in no RFC and no profile: an answer a client cannot classify.
	// The refresh token is not looked at and stays valid.
	FaultUnknownCode
	// FaultNotJSON answers 400 with an HTML page, as a proxy or a broken
	// provider may. The refresh token stays valid.
	FaultNotJSON
)

// UnknownCode is the code FaultUnknownCode answers with.
const UnknownCode = "account_under_review"

func (f Fault) String() string {
	switch f {
	case FaultNone:
		return "none"
	case FaultUnavailable:
		return "unavailable"
	case FaultTooManyRequests:
		return "too-many-requests"
	case FaultHang:
		return "hang"
	case FaultInvalidGrant:
		return "invalid-grant"
	case FaultInvalidClient:
		return "invalid-client"
	case FaultLostAnswer:
		return "lost-answer"
	case FaultUnknownCode:
		return "unknown-code"
	case FaultNotJSON:
		return "not-json"
	}
	return fmt.Sprintf("Fault(%d)", int(f))
}

// Options configures a Provider. The zero value is usable.
type Options struct {
	// ClientID and ClientSecret of the single registered confidential client.
	// Defaults "tokenguard" / "tokenguard-secret". The client may
	// authenticate with client_secret_basic or client_secret_post, unless
	// ClientAuth restricts it to one.
	ClientID, ClientSecret string
	// ClientAuth restricts the client authentication the token endpoint
	// accepts to one method: ClientAuthBasic or ClientAuthPost (the
	// client's token_endpoint_auth_method, enforced by fosite: the other
	// method is answered 401 invalid_client). Empty accepts both.
	ClientAuth string
	// RedirectURIs allowed in the authorization-code flow. Default
	// {"http://127.0.0.1/callback"}. Loopback URIs match any port (RFC 8252).
	// An entry "*" accepts any redirect URI that fosite considers valid
	// (absolute, no fragment, https or loopback http).
	RedirectURIs []string
	// AccessTokenLifespan defaults to 1h. It may be sub-second; expires_in
	// is then reported as 1 (its minimum, since 0 means "unknown").
	AccessTokenLifespan time.Duration
	// RefreshTokenLifespan defaults to 30 days; negative means never expire.
	RefreshTokenLifespan time.Duration
	// RefreshLatency is slept inside every refresh_token grant that is not
	// faulted, while holding the rotation lock, between fosite's validation
	// of the presented refresh token and its rotation. It simulates a slow
	// provider; refreshes queue behind each other. The rotation completes
	// even if the client gives up meanwhile, like a real provider whose
	// response is lost.
	RefreshLatency time.Duration
	// RefreshFault is called once per refresh_token grant request, before
	// anything else and without holding the rotation lock; it may be called
	// concurrently. Nil means never fault.
	RefreshFault func() Fault
	// Scopes the client may request. Default {"api"}. "offline" and
	// "offline_access" are always allowed in addition.
	Scopes []string
	// OmitExpiresIn leaves expires_in out of token answers, as providers
	// that never say how long a token lives do: clients learn it from a 401.
	OmitExpiresIn bool
	// RefreshScopes, when not nil, narrows what a refresh grants to those
	// of the grant's scopes it lists (the refresh answer's scope says so,
	// and the rotated tokens carry only those): a provider that grants
	// fewer scopes than at consent. Empty and not nil: none.
	RefreshScopes []string
	// OmitRefreshScope leaves scope out of refresh answers, as RFC 6749
	// §5.1 allows when it is unchanged.
	OmitRefreshScope bool

	// The switches below emulate what real providers do differently (the
	// provider profiles declare it). Zero values: the strict RFC server.

	// DeadGrant, when set, is how a dead refresh token (rotated away,
	// revoked, expired: whatever fosite answers invalid_grant, and
	// FaultInvalidGrant) is answered instead of 400 {"error":"invalid_grant"}:
	// GitHub's 200 {"error":"bad_refresh_token"}, freee's 401, Slack's
	// 200 {"ok":false,...}, HubSpot's {"status":"BAD_REFRESH_TOKEN"}.
	DeadGrant *DeadGrantAnswer
	// ReuseGrace is the window in which a rotated refresh token presented
	// again gets the answer its first presentation got (the same new
	// tokens), as Xero (30 min), Atlassian (10 min) and Auth0's overlap
	// period allow; it is counted in Stats.GraceReplays, not as reuse.
	// After it, reuse is what it always is. 0: no grace (strict).
	ReuseGrace time.Duration
	// RefreshAbsolute refuses (as a dead grant) every refresh of a grant
	// this long after its consent (the code exchange), however often it
	// was refreshed. 0: no absolute expiry. RefreshTokenLifespan is the
	// idle expiry: each rotated refresh token lives that long.
	RefreshAbsolute time.Duration
	// Tenant, when set, serves the token endpoint only at
	// /t/{Tenant}/oauth2/token (per-tenant token URLs, as Smaregi's
	// contract id or Okta's domain); /oauth2/token and any other tenant
	// answer 404.
	Tenant string
	// ExtraTokenFields are added to every token answer (Salesforce's
	// instance_url, Zoho's api_domain).
	ExtraTokenFields map[string]string
	// TokenRate limits the token endpoint to this many requests a second
	// (every grant type, every client): beyond it, 429 with Retry-After: 1,
	// counted in Stats.RateLimited. 0: no limit.
	TokenRate int
}

// DeadGrantAnswer is how a provider words a dead grant: HTTP Status with
// Code in the body's Field ("error" when empty); OKFalse adds Slack's
// "ok": false.
type DeadGrantAnswer struct {
	Status      int
	Field       string
	Code        string
	OKFalse     bool
	Description string // error_description, when set
}

// Client authentication methods for Options.ClientAuth (RFC 7591 names).
const (
	ClientAuthBasic = "client_secret_basic" // HTTP Basic only
	ClientAuthPost  = "client_secret_post"  // form body only
)

// maxHang bounds FaultHang so that a client without a timeout cannot wedge a
// test server (httptest.Server.Close waits for running handlers) forever.
const maxHang = time.Minute

// Provider is a strict OAuth2 authorization server plus a protected resource.
// Create it with New and serve Handler().
type Provider struct {
	oauth      fosite.OAuth2Provider
	store      *store
	strategy   *fositeoauth2.HMACSHAStrategy
	atLifespan time.Duration
	rtLifespan time.Duration // <= 0: refresh tokens never expire
	clientID   string
	secret     string     // as registered; ClientSecret tells the current one
	secretMu   sync.Mutex // orders RotateClientSecret and DropOldClientSecrets
	clientAuth string
	redirect   string // default redirect URI for OAuth2Config
	scopes     []string
	omitExpiry bool
	deadGrant  *DeadGrantAnswer
	grace      time.Duration
	absolute   time.Duration
	tenant     string
	extra      map[string]string

	// refreshScopes, omitRefreshScope: Options.RefreshScopes and
	// OmitRefreshScope.
	refreshScopes    []string
	omitRefreshScope bool

	// answered keeps, per rotated refresh token (by signature), the
	// answer it got and when, for ReuseGrace; consented, per grant, when
	// its code was exchanged, for RefreshAbsolute.
	graceMu   sync.Mutex
	answered  map[string]graceAnswer
	consented map[string]time.Time

	// grantLocks serialise refresh_token grants of one grant family from
	// fosite's request parsing to the response write. fosite's MemoryStore
	// is not transactional: without this two requests presenting the same
	// refresh token could both load it as active before either rotates it,
	// and both would succeed. Refreshes of different grants run in
	// parallel, like at a real provider: a lock per grant, not stripes
	// shared by hash, which would make a refresh wait out another grant's
	// latency. Code exchanges and /resource never take these locks;
	// RevokeAll excludes them all (revoking).
	revoking   sync.RWMutex
	grantLocks keyedLocks

	limiter atomic.Pointer[rate.Limiter] // Options.TokenRate (SetTokenRate); nil: none

	dpop dpopState // the grants bound to a DPoP key (dpop.go)

	refreshLatency atomic.Int64 // time.Duration
	refreshFault   atomic.Pointer[func() Fault]

	stats    counters
	timeline timeline
}

// New builds a Provider with its own random HMAC secret and empty store.
func New(opts Options) (*Provider, error) {
	if opts.ClientID == "" {
		opts.ClientID = "tokenguard"
	}
	if opts.ClientSecret == "" {
		opts.ClientSecret = "tokenguard-secret"
	}
	if len(opts.RedirectURIs) == 0 {
		opts.RedirectURIs = []string{"http://127.0.0.1/callback"}
	}
	if opts.AccessTokenLifespan < 0 {
		return nil, errors.New("sandbox: negative AccessTokenLifespan")
	}
	if opts.AccessTokenLifespan == 0 {
		opts.AccessTokenLifespan = time.Hour
	}
	if opts.RefreshTokenLifespan == 0 {
		opts.RefreshTokenLifespan = 30 * 24 * time.Hour
	}
	if opts.RefreshLatency < 0 {
		return nil, errors.New("sandbox: negative RefreshLatency")
	}
	if len(opts.Scopes) == 0 {
		opts.Scopes = []string{"api"}
	}
	if opts.ClientAuth != "" && opts.ClientAuth != ClientAuthBasic && opts.ClientAuth != ClientAuthPost {
		return nil, fmt.Errorf("sandbox: ClientAuth %q is neither %s nor %s", opts.ClientAuth, ClientAuthBasic, ClientAuthPost)
	}

	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, fmt.Errorf("sandbox: global secret: %w", err)
	}

	rtLifespan := opts.RefreshTokenLifespan
	fositeRT := rtLifespan
	if rtLifespan < 0 {
		rtLifespan, fositeRT = 0, -1 // fosite: -1 means "no expiry"
	}

	cfg := &fosite.Config{
		AccessTokenLifespan:  opts.AccessTokenLifespan,
		RefreshTokenLifespan: fositeRT,
		GlobalSecret:         secret,
		// Empty (not nil): issue refresh tokens without requiring the
		// "offline"/"offline_access" scope, see the package doc.
		RefreshTokenScopes: []string{},
		ScopeStrategy:      fosite.ExactScopeStrategy,
		// Set explicitly: fosite's getters lazily assign these defaults,
		// which is a data race under concurrent requests.
		AudienceMatchingStrategy: fosite.DefaultAudienceMatchingStrategy,
		ClientSecretsHasher:      plainSecret{},
		// /resource introspects access tokens only; otherwise fosite would
		// fall back to accepting refresh tokens as bearer tokens.
		DisableRefreshTokenValidation: true,
	}

	ms := storage.NewMemoryStore()
	client := &fosite.DefaultClient{
		ID:            opts.ClientID,
		Secret:        []byte(opts.ClientSecret), // compared by plainSecret
		RedirectURIs:  slices.Clone(opts.RedirectURIs),
		GrantTypes:    []string{"authorization_code", "refresh_token"},
		ResponseTypes: []string{"code"},
		Scopes:        append(slices.Clone(opts.Scopes), "offline", "offline_access"),
	}
	ms.Clients[opts.ClientID] = client
	if opts.ClientAuth != "" {
		// fosite checks token_endpoint_auth_method only for OpenID
		// Connect clients.
		ms.Clients[opts.ClientID] = &fosite.DefaultOpenIDConnectClient{DefaultClient: client, TokenEndpointAuthMethod: opts.ClientAuth}
	}
	st := newStore(ms, slices.Contains(opts.RedirectURIs, "*"))

	strategy := compose.NewOAuth2HMACStrategy(cfg)
	p := &Provider{
		oauth: compose.Compose(cfg, st, strategy,
			compose.OAuth2AuthorizeExplicitFactory,
			compose.OAuth2RefreshTokenGrantFactory,
			compose.OAuth2TokenIntrospectionFactory,
			compose.OAuth2TokenRevocationFactory,
		),
		store:      st,
		strategy:   strategy,
		atLifespan: opts.AccessTokenLifespan,
		rtLifespan: rtLifespan,
		clientID:   opts.ClientID,
		secret:     opts.ClientSecret,
		clientAuth: opts.ClientAuth,
		redirect:   defaultRedirect(opts.RedirectURIs),
		scopes:     slices.Clone(opts.Scopes),
		omitExpiry: opts.OmitExpiresIn,
		deadGrant:  opts.DeadGrant,
		grace:      opts.ReuseGrace,
		absolute:   opts.RefreshAbsolute,
		tenant:     opts.Tenant,
		extra:      maps.Clone(opts.ExtraTokenFields),
		answered:   map[string]graceAnswer{},
		consented:  map[string]time.Time{},
	}
	p.omitRefreshScope = opts.OmitRefreshScope
	if opts.RefreshScopes != nil {
		p.refreshScopes = append([]string{}, opts.RefreshScopes...)
	}
	p.SetTokenRate(opts.TokenRate)
	p.SetRefreshLatency(opts.RefreshLatency)
	p.SetRefreshFault(opts.RefreshFault)
	p.stats.reset()
	p.timeline.reset()
	return p, nil
}

func defaultRedirect(uris []string) string {
	for _, u := range uris {
		if u != "*" {
			return u
		}
	}
	return "http://127.0.0.1/callback"
}

// SetRefreshFault replaces Options.RefreshFault; nil disables faults. It is
// safe to call while requests are in flight.
func (p *Provider) SetRefreshFault(f func() Fault) {
	if f == nil {
		p.refreshFault.Store(nil)
		return
	}
	p.refreshFault.Store(&f)
}

// SetRefreshLatency replaces Options.RefreshLatency; safe to call while
// requests are in flight.
func (p *Provider) SetRefreshLatency(d time.Duration) {
	p.refreshLatency.Store(int64(max(d, 0)))
}

// RevokeAll revokes every grant issued so far: their refresh tokens answer
// invalid_grant and their access tokens 401. Authorization codes not yet
// exchanged are not affected, and new grants work as before. Revoked refresh
// tokens were not rotated, so presenting them does not count as reuse.
func (p *Provider) RevokeAll() {
	// Taking the rotation lock keeps a refresh in flight from re-issuing
	// tokens for a grant right after we revoked it.
	p.revoking.Lock()
	defer p.revoking.Unlock()
	p.store.revokeAll()
}

// OAuth2Config returns a client configuration for a Provider served at
// baseURL: its client credentials, Endpoint(baseURL) (with the form-body
// auth style when Options.ClientAuth is ClientAuthPost), the first
// configured redirect URI and Options.Scopes.
func (p *Provider) OAuth2Config(baseURL string) *oauth2.Config {
	return &oauth2.Config{
		ClientID:     p.clientID,
		ClientSecret: p.ClientSecret(),
		Endpoint:     p.endpointFor(baseURL),
		RedirectURL:  p.redirect,
		Scopes:       slices.Clone(p.scopes),
	}
}

// TokenURL is the provider's token endpoint under baseURL: per tenant
// when Options.Tenant is set.
func (p *Provider) TokenURL(baseURL string) string {
	if p.tenant != "" {
		return baseURL + "/t/" + p.tenant + "/oauth2/token"
	}
	return baseURL + "/oauth2/token"
}

// Endpoint returns the sandbox endpoints under baseURL, using
// client_secret_basic.
func Endpoint(baseURL string) oauth2.Endpoint {
	return oauth2.Endpoint{
		AuthURL:   baseURL + "/oauth2/auth",
		TokenURL:  baseURL + "/oauth2/token",
		AuthStyle: oauth2.AuthStyleInHeader,
	}
}

// RevocationURL is the sandbox's revocation endpoint under baseURL
// (RFC 7009).
func RevocationURL(baseURL string) string { return baseURL + "/oauth2/revoke" }

// endpointFor is Endpoint with the tenant's token URL and the auth style
// the client is restricted to.
func (p *Provider) endpointFor(baseURL string) oauth2.Endpoint {
	e := Endpoint(baseURL)
	e.TokenURL = p.TokenURL(baseURL)
	if p.clientAuth == ClientAuthPost {
		e.AuthStyle = oauth2.AuthStyleInParams
	}
	return e
}

// lockGrant takes the lock of the grant family the refresh token (by
// signature) belongs to (unknown tokens lock their signature) and returns
// its unlock.
func (p *Provider) lockGrant(ctx context.Context, signature string) (unlock func()) {
	p.revoking.RLock()
	unlockKey := p.grantLocks.lock(p.grantOf(ctx, signature))
	return func() { unlockKey(); p.revoking.RUnlock() }
}

// grantOf is the grant family (fosite request id) the refresh token (by
// signature) belongs to, rotated away or not; an unknown token's is its
// signature.
func (p *Provider) grantOf(ctx context.Context, signature string) string {
	if req, err := p.store.GetRefreshTokenSession(ctx, signature, nil); req != nil && (err == nil || errors.Is(err, fosite.ErrInactiveToken)) {
		return req.GetID()
	}
	return signature
}

// keyedLocks is a mutex per key, kept while some caller holds or waits
// for it.
type keyedLocks struct {
	mu    sync.Mutex
	locks map[string]*keyedLock
}

type keyedLock struct {
	sync.Mutex
	users int // holding or waiting; guarded by keyedLocks.mu
}

func (k *keyedLocks) lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = make(map[string]*keyedLock)
	}
	l := k.locks[key]
	if l == nil {
		l = &keyedLock{}
		k.locks[key] = l
	}
	l.users++
	k.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		k.mu.Lock()
		if l.users--; l.users == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}

// SetTokenRate limits the token endpoint to n requests a second from now
// on, as Options.TokenRate does, its bucket full (0: no limit).
func (p *Provider) SetTokenRate(n int) {
	if n <= 0 {
		p.limiter.Store(nil)
		return
	}
	p.limiter.Store(rate.NewLimiter(rate.Limit(n), n))
}
