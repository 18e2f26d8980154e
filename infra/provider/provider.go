// Package provider talks to the OAuth2 provider's token endpoint and turns
// its answers into domain values and classified errors.
package provider

import (
	"cmp"
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
	"github.com/tokenguard/tokenguard/infra/dpop"
	"github.com/tokenguard/tokenguard/infra/provider/profiles"
)

// NewHTTPClient returns a client whose every phase is bounded by timeout, so a
// silent provider cannot hold a connection's lock longer.
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

// Refresher redeems refresh tokens at cfg's token endpoint; safe for concurrent
// use. Not x/oauth2's TokenSource: its auto-detection resends after any failure a
// refresh token the provider may have spent. AutoDetect starts with the remembered
// style, else HTTP Basic (RFC 6749 §2.3.1), and switches only when the client's
// authentication failed: only then was the refresh token surely not looked at.
type Refresher struct {
	cfg             *oauth2.Config
	auth            clientAuth
	styles          AuthStyleStore
	defaultLifetime time.Duration
	profile         profiles.Profile // dead-grant codes, Extra fields, refresh token expiries
	log             *slog.Logger
	now             func() time.Time
	nonces          *dpop.Nonces

	learned atomic.Int32 // oauth2.AuthStyle that last succeeded in auto; 0 unknown
	stored  atomic.Int32 // the style the store is known to hold; 0 unknown
	loaded  atomic.Bool
	loading sync.Mutex // one store read at a time; others do not wait for it
	saving  atomic.Bool

	evidence    EvidenceStore // see weigh
	rules       EvidenceRules
	credentials string
	workedMu    sync.Mutex
	workedAt    time.Time
	workedStyle oauth2.AuthStyle
}

// AuthStyleStore keeps the accepted auth style per token URL and client id, so
// other processes need not probe. Load returns "" when nothing is stored.
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

// WithDefaultLifetime is the lifetime of access tokens without a usable
// expires_in (0, the default: no expiry).
func WithDefaultLifetime(d time.Duration) Option {
	return func(r *Refresher) { r.defaultLifetime = max(d, 0) }
}

// WithProfile applies a profile's dead-grant codes, Extra fields and refresh
// token expiries (used when the answer does not say them).
func WithProfile(p profiles.Profile) Option { return func(r *Refresher) { r.profile = p } }

// WithLogger receives a line when a style is learned or cannot be stored.
func WithLogger(l *slog.Logger) Option { return func(r *Refresher) { r.log = l } }

// WithClock is the clock expiries are computed with (default time.Now).
func WithClock(now func() time.Time) Option { return func(r *Refresher) { r.now = now } }

// WithNonces shares the DPoP nonces with the rest of the process.
func WithNonces(n *dpop.Nonces) Option { return func(r *Refresher) { r.nonces = n } }

// storeTimeout bounds a store read or write: a failed one costs at most a
// rejected probe, never a refresh token.
const storeTimeout = 2 * time.Second

// NewRefresher calls cfg's endpoint with client (NewHTTPClient when nil),
// never following redirects: a POST with credentials must not be redirected.
func NewRefresher(cfg *oauth2.Config, client *http.Client, opts ...Option) *Refresher {
	if client == nil {
		client = NewHTTPClient(10 * time.Second)
	}
	c := *client
	c.CheckRedirect = noRedirect
	r := &Refresher{cfg: cfg, now: time.Now, rules: AllEvidence, credentials: Credentials(cfg)}
	for _, o := range opts {
		o(r)
	}
	r.nonces, r.log = cmp.Or(r.nonces, &dpop.Nonces{}), cmp.Or(r.log, slog.New(slog.DiscardHandler))
	r.auth.id, r.auth.secret, r.auth.tokenURL, r.auth.now, r.auth.hc = cfg.ClientID, cfg.ClientSecret, cfg.Endpoint.TokenURL, r.now, &c
	c.Transport = &dpop.TokenTransport{Base: c.Transport, Nonces: r.nonces, Now: r.now}
	return r
}

func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// Refresh redeems refreshToken. Errors are classified *domain.ProviderError.
func (r *Refresher) Refresh(ctx context.Context, refreshToken domain.Secret) (domain.Grant, error) {
	var g domain.Grant
	form := refreshForm(refreshToken.Reveal())
	style, pe := r.authenticated(ctx, true, func(style oauth2.AuthStyle) (pe *domain.ProviderError) {
		_, g, pe = r.exchange(ctx, form, style, true)
		return pe
	})
	if pe != nil {
		r.weigh(ctx, pe, style)
		return domain.Grant{}, pe
	}
	return g, nil
}

// authenticated calls send in the configured style; in auto, once more in the
// other style only when the client's authentication failed. It returns the last style sent.
func (r *Refresher) authenticated(ctx context.Context, logSwitch bool,
	send func(oauth2.AuthStyle) *domain.ProviderError) (oauth2.AuthStyle, *domain.ProviderError) {
	style := r.cfg.Endpoint.AuthStyle
	auto := style == oauth2.AuthStyleAutoDetect
	if auto {
		style = r.startStyle(ctx)
	}
	pe := send(style)
	if auto && pe != nil && clientAuthFailed(pe) {
		style = other(style)
		pe = send(style)
		if pe == nil && logSwitch {
			r.log.Info("token endpoint accepted the client only with this auth style; remembered",
				"token_url", r.cfg.Endpoint.TokenURL, "auth_style", styleName(style))
		}
	}
	if pe == nil {
		if auto {
			r.remember(style)
		}
		r.worked(style)
	}
	return style, pe
}

func (r *Refresher) startStyle(ctx context.Context) oauth2.AuthStyle {
	if r.learned.Load() == 0 && r.styles != nil && !r.loaded.Load() && r.loading.TryLock() {
		defer r.loading.Unlock()
		lctx, cancel := context.WithTimeout(ctx, storeTimeout)
		name, err := r.styles.Load(lctx, r.cfg.Endpoint.TokenURL, r.cfg.ClientID)
		cancel()
		if err == nil {
			r.loaded.Store(true)
			if s := AuthStyleOf(name); s != oauth2.AuthStyleAutoDetect {
				r.stored.Store(int32(s))
				r.learned.CompareAndSwap(0, int32(s))
			}
		} else {
			r.log.Warn("could not read the remembered token endpoint auth style; starting with HTTP Basic", "err", err)
		}
	}
	return cmp.Or(oauth2.AuthStyle(r.learned.Load()), oauth2.AuthStyleInHeader)
}

// remember keeps style in memory and, when new, in the store in the
// background: nothing may delay persisting a rotated refresh token.
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
			r.log.Warn("could not store the token endpoint auth style; other processes may probe it once", "err", err)
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

// AuthStyleOf is the x/oauth2 form of a style (StyleHeader, StyleParams;
// anything else, private_key_jwt included, is auto).
func AuthStyleOf(name string) oauth2.AuthStyle { return authStyles[name] }

var authStyles = map[string]oauth2.AuthStyle{StyleHeader: oauth2.AuthStyleInHeader, StyleParams: oauth2.AuthStyleInParams}

// GrantFrom converts an x/oauth2 token from the authorization-code exchange.
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
