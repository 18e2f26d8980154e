// Package provider talks to the OAuth2 provider's token endpoint and turns
// its answers into domain values and classified errors.
package provider

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/clientkey"
	"github.com/tokenguard/tokenguard/infra/dpop"
	"github.com/tokenguard/tokenguard/infra/provider/profiles"
)

// NewHTTPClient returns a client for the token endpoint whose every phase
// is bounded, so a provider that stops answering cannot hold a
// connection's lock for longer than timeout.
func NewHTTPClient(timeout time.Duration) *http.Client {
	dialer := &net.Dialer{Timeout: min(5*time.Second, timeout), KeepAlive: 30 * time.Second}
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           dialer.DialContext,
			TLSHandshakeTimeout:   min(5*time.Second, timeout),
			ResponseHeaderTimeout: timeout,
			IdleConnTimeout:       90 * time.Second,
			MaxIdleConnsPerHost:   4,
			ForceAttemptHTTP2:     true,
		},
		CheckRedirect: noRedirect,
	}
}

// Refresher redeems refresh tokens at the token endpoint of an
// oauth2.Config (ClientID, ClientSecret, Endpoint.TokenURL and
// Endpoint.AuthStyle). It is safe for concurrent use.
//
// It sends the token request itself instead of using x/oauth2's
// TokenSource, whose auth-style auto-detection resends the request in the
// other style after any failure (a timeout or invalid_grant included),
// presenting a refresh token the provider may already have spent; it also
// rejects a fractional expires_in, ignores refresh_token_expires_in and
// HubSpot's code outside "error", and prints the body in its errors.
//
// Client authentication follows cfg.Endpoint.AuthStyle: InHeader (HTTP
// Basic) and InParams are used as they are. AutoDetect starts with the
// style remembered for this token URL and client (in memory and in the
// AuthStyleStore), else HTTP Basic, which RFC 6749 §2.3.1 makes mandatory.
// Only when the client's authentication failed (invalid_client, or a 401)
// is the request sent once more in the other style: the provider then never
// looked at the refresh token. After any other failure the first request may
// have been processed, and presenting its token again is the reuse strict
// providers punish by revoking the grant.
type Refresher struct {
	cfg             *oauth2.Config
	client          *http.Client
	styles          AuthStyleStore
	defaultLifetime time.Duration
	deadGrants      []profiles.DeadGrant // the profile's own words for a dead grant
	extraFields     []string             // answer fields kept as connection metadata
	refreshIdle     time.Duration        // the profile's idle expiry of refresh tokens; 0 unknown
	refreshAbsolute time.Duration        // the profile's absolute expiry of a grant; 0 unknown
	log             *slog.Logger
	now             func() time.Time
	evidenceState   // weighs ambiguous refusals (evidence.go)

	learned atomic.Int32 // oauth2.AuthStyle that last succeeded in auto; 0 while unknown
	stored  atomic.Int32 // the style the store is known to hold; 0 while unknown
	loaded  atomic.Bool  // the store was read
	loading sync.Mutex   // one read of the store at a time; others do not wait for it
	saving  atomic.Bool  // a write to the store is under way
	nonces  *dpop.Nonces // the DPoP nonces token endpoints handed out
	// private_key_jwt: the client's key and the assertions' audience.
	clientKey    *clientkey.Key
	assertionAud string
	issuerAud    *Discovery // the assertions' audience is the issuer it finds
	resource     string     // RFC 8707 resource indicator; "" none
}

// AuthStyleStore keeps, per token URL and client id, the auth style the
// provider accepted, so other processes and restarts need not probe.
// Load returns "" when nothing is stored.
type AuthStyleStore interface {
	Load(ctx context.Context, tokenURL, clientID string) (string, error)
	Save(ctx context.Context, tokenURL, clientID, style string) error
}

// The styles as an AuthStyleStore holds them.
const (
	StyleHeader = "header"
	StyleParams = "params"
)

// Option configures a Refresher.
type Option func(*Refresher)

// WithAuthStyleStore remembers the learned auth style in s too.
func WithAuthStyleStore(s AuthStyleStore) Option { return func(r *Refresher) { r.styles = s } }

// WithDefaultLifetime gives access tokens whose answer has no usable
// expires_in this lifetime (0, the default: no expiry; the token is used
// until the API answers 401).
func WithDefaultLifetime(d time.Duration) Option {
	return func(r *Refresher) { r.defaultLifetime = max(d, 0) }
}

// WithProfile applies what a provider profile says about the answers: its
// codes for a dead grant (GitHub's bad_refresh_token in a 200 body), the
// fields kept as Extra (Salesforce instance_url), and the refresh token's
// expiry when the answer does not say it (see grant).
func WithProfile(p profiles.Profile) Option {
	return func(r *Refresher) {
		r.deadGrants = p.DeadGrants
		r.extraFields = p.ExtraFields
		if p.RefreshIdle.Known {
			r.refreshIdle = p.RefreshIdle.D
		}
		if p.RefreshAbsolute.Known {
			r.refreshAbsolute = p.RefreshAbsolute.D
		}
	}
}

// WithLogger receives a line when a style is learned or cannot be stored.
func WithLogger(l *slog.Logger) Option { return func(r *Refresher) { r.log = l } }

// WithClock is the clock expiries are computed with (default time.Now):
// the one every process decides staleness with.
func WithClock(now func() time.Time) Option { return func(r *Refresher) { r.now = now } }

// storeTimeout bounds a read or write of the AuthStyleStore: a failed read
// costs at most one rejected probe, never a refresh token.
const storeTimeout = 2 * time.Second

// NewRefresher uses cfg's client and endpoint, and client for the HTTP
// calls (NewHTTPClient when nil). Redirects are never followed, whatever
// its CheckRedirect: a token endpoint has no business redirecting a POST
// with credentials.
func NewRefresher(cfg *oauth2.Config, client *http.Client, opts ...Option) *Refresher {
	if client == nil {
		client = NewHTTPClient(10 * time.Second)
	}
	c := *client
	c.CheckRedirect = noRedirect
	r := &Refresher{cfg: cfg, client: &c, now: time.Now}
	r.rules, r.credentials = AllEvidence, Credentials(cfg)
	for _, o := range opts {
		o(r)
	}
	if r.nonces == nil {
		r.nonces = &dpop.Nonces{}
	}
	// Requests of a DPoP-bound grant carry a proof; others pass untouched.
	c.Transport = &dpop.TokenTransport{Base: c.Transport, Nonces: r.nonces, Now: r.now}
	return r
}

func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// Refresh redeems refreshToken. Errors are *domain.ProviderError; their
// Class says what the answer means for the grant (see classify).
func (r *Refresher) Refresh(ctx context.Context, refreshToken domain.Secret) (domain.Grant, error) {
	var g domain.Grant
	var last oauth2.AuthStyle
	pe := r.authenticated(ctx, true, func(style oauth2.AuthStyle) (pe *domain.ProviderError) {
		last = style
		g, pe = r.exchange(ctx, refreshToken, style)
		return pe
	})
	if pe != nil {
		r.weigh(ctx, pe, last)
		return domain.Grant{}, pe
	}
	return g, nil
}

// authenticated calls send in the configured style. In auto it starts with
// startStyle and, only when the client's authentication failed (the
// provider did not look at the refresh token or the code), calls it once
// more in the other style; the style that succeeds is remembered.
func (r *Refresher) authenticated(ctx context.Context, logSwitch bool, send func(oauth2.AuthStyle) *domain.ProviderError) *domain.ProviderError {
	style := r.cfg.Endpoint.AuthStyle
	if style != oauth2.AuthStyleAutoDetect {
		pe := send(style)
		if pe == nil {
			r.worked(style)
		}
		return pe
	}
	style = r.startStyle(ctx)
	pe := send(style)
	if pe != nil && clientAuthFailed(pe) {
		style = other(style)
		pe = send(style)
		if pe == nil && logSwitch && r.log != nil {
			r.log.Info("token endpoint accepted the client only with this auth style; remembered",
				"token_url", r.cfg.Endpoint.TokenURL, "auth_style", styleName(style))
		}
	}
	if pe == nil {
		r.remember(style)
		r.worked(style)
	}
	return pe
}

// startStyle is the style auto begins with: the learned one, else the
// stored one, else HTTP Basic.
func (r *Refresher) startStyle(ctx context.Context) oauth2.AuthStyle {
	if s := oauth2.AuthStyle(r.learned.Load()); s != oauth2.AuthStyleAutoDetect {
		return s
	}
	if r.styles != nil && !r.loaded.Load() && r.loading.TryLock() {
		defer r.loading.Unlock()
		lctx, cancel := context.WithTimeout(ctx, storeTimeout)
		name, err := r.styles.Load(lctx, r.cfg.Endpoint.TokenURL, r.cfg.ClientID)
		cancel()
		switch {
		case err != nil:
			if r.log != nil {
				r.log.Warn("could not read the remembered token endpoint auth style; starting with HTTP Basic", "err", err)
			}
		default:
			r.loaded.Store(true)
			if s := styleFromName(name); s != oauth2.AuthStyleAutoDetect {
				r.stored.Store(int32(s))
				r.learned.CompareAndSwap(0, int32(s))
			}
		}
	}
	if s := oauth2.AuthStyle(r.learned.Load()); s != oauth2.AuthStyleAutoDetect {
		return s
	}
	return oauth2.AuthStyleInHeader
}

// remember keeps style, which just succeeded, in memory and, when new, in
// the store, in the background: the caller is about to persist a rotated
// refresh token, and nothing may delay that.
func (r *Refresher) remember(style oauth2.AuthStyle) {
	r.learned.Store(int32(style))
	if r.styles == nil || r.stored.Load() == int32(style) || !r.saving.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer r.saving.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
		defer cancel()
		if err := r.styles.Save(ctx, r.cfg.Endpoint.TokenURL, r.cfg.ClientID, styleName(style)); err != nil {
			if r.log != nil {
				r.log.Warn("could not store the token endpoint auth style; other processes may probe it once", "err", err)
			}
			return
		}
		r.stored.Store(int32(style))
	}()
}

func other(s oauth2.AuthStyle) oauth2.AuthStyle {
	if s == oauth2.AuthStyleInParams {
		return oauth2.AuthStyleInHeader
	}
	return oauth2.AuthStyleInParams
}

func styleName(s oauth2.AuthStyle) string {
	if s == oauth2.AuthStyleInParams {
		return StyleParams
	}
	return StyleHeader
}

func styleFromName(name string) oauth2.AuthStyle {
	switch name {
	case StyleHeader:
		return oauth2.AuthStyleInHeader
	case StyleParams:
		return oauth2.AuthStyleInParams
	}
	return oauth2.AuthStyleAutoDetect
}

// GrantFrom converts an x/oauth2 token (from the authorization-code
// exchange), with the refresh token's lifetime and the scope when the
// answer named them.
func GrantFrom(tok *oauth2.Token) domain.Grant {
	g := domain.Grant{
		AccessToken:  domain.NewSecret(tok.AccessToken),
		TokenType:    tok.Type(),
		RefreshToken: domain.NewSecret(tok.RefreshToken),
		Expiry:       tok.Expiry,
	}
	f := fields{}
	for _, k := range refreshLifetimeKeys {
		f[k], _ = json.Marshal(tok.Extra(k))
	}
	if d, ok := f.refreshLifetime(); ok {
		g.RefreshExpiry = time.Now().Add(d)
	}
	g.Scope, g.ScopeNamed = tok.Extra("scope").(string)
	return g
}

// RetryAfter reads a Retry-After header in either of its forms.
func RetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if secs, err := strconv.Atoi(v); err == nil && secs >= 0 {
		return time.Duration(secs) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}
