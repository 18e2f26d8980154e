// Package console is the operator console at /console: server-rendered
// pages (no script) that list connections, show one's history, and run
// the operator's actions through the calls tokenctl uses.
//
// An API key entered on the login form opens a session: a random token in
// an HttpOnly, SameSite=Strict cookie, stored hashed server-side, so that
// logout, expiry and revoking the key end it at once. Forms carry a CSRF
// token (an HMAC of the session token; at login, of a pre-login cookie).
package console

import (
	"bytes"
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"errors"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"golang.org/x/time/rate"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/httpapi/ratelimit"
)

// KeyVerifier says what an API key may do; domain.ErrUnauthorized if none.
type KeyVerifier interface {
	Verify(ctx context.Context, key domain.Secret) (domain.KeyAccess, error)
}

// Pages reads connections a page at a time, in name order, without tokens.
type Pages interface {
	FilteredConnectionsPage(ctx context.Context, f domain.ConnectionFilter, after string, limit int) ([]domain.Connection, error)
}

// Visible is up to limit connections after after that f and acc match
// (the store narrows by acc's patterns, acc's rule decides), and next, the
// after of the following page ("" on the last). The API uses it too.
func Visible(ctx context.Context, src Pages, acc domain.KeyAccess, f domain.ConnectionFilter,
	after string, limit int) (page []domain.Connection, next string, err error) {
	f.Patterns = acc.Connections
	for {
		// One more row than asked says whether a next page exists.
		rows, err := src.FilteredConnectionsPage(ctx, f, after, limit+1)
		if err != nil {
			return nil, "", err
		}
		for _, c := range rows {
			if acc.AllowsConnection(c.Name) {
				page = append(page, c)
			}
		}
		if len(page) > limit {
			return page[:limit], page[limit-1].Name, nil
		}
		if len(rows) <= limit {
			return page, "", nil
		}
		after = rows[len(rows)-1].Name
	}
}

// Provider is a provider's settings as shown: never its client secret.
type Provider struct {
	Name        string // "" for the OAUTH_* one
	Profile     string
	TokenURL    string
	AuthURL     string
	RevokeURL   string
	APIBaseURL  string
	ClientID    string
	AuthStyle   string // configured: auto, header, params
	LearnedAuth string // what auto learned at the token endpoint; "" none yet
	Scopes      []string
	Skew        time.Duration // 0: the process's setting
	Lifetime    time.Duration // default access token lifetime; 0: none
	KeepAlive   time.Duration
}

// Deps are what the console is built from.
type Deps struct {
	Keys KeyVerifier
	// Sessions stores console sessions by a hash of their token.
	Sessions interface {
		Create(ctx context.Context, keyID int32, lifetime time.Duration) (domain.Secret, time.Time, error)
		// Lookup is the live session's key as it is now; else domain.ErrUnauthorized.
		Lookup(ctx context.Context, token domain.Secret) (domain.KeyAccess, error)
		Delete(ctx context.Context, token domain.Secret) error
	}
	// Connections reads connections as listings show them (no token).
	Connections interface {
		Pages
		Connection(ctx context.Context, name string) (domain.Connection, error)
	}
	// History reads the connections' recent history.
	History interface {
		Recent(ctx context.Context, connection string, limit int) ([]domain.ConnectionEvent, error)
		LastRefreshes(ctx context.Context, connections []string) (map[string]domain.ConnectionEvent, error)
		RefreshRates(ctx context.Context, since time.Time) (map[string]domain.RefreshRate, error)
	}
	// Actions are the operator's changes, as tokenctl runs them (its Store).
	Actions interface {
		Reactivate(ctx context.Context, connection, reason string) (found domain.Token, version int64, err error)
		Disconnect(ctx context.Context, connection string, revoke bool) (domain.Token, error)
	}
	// Links creates a connect link, as POST /connect-sessions does.
	Links interface {
		ConnectLink(ctx context.Context, connection, provider, createdBy, returnTo string) (link string, expires time.Time, err error)
	}
	Providers func(ctx context.Context) ([]Provider, error) // those connections may name
	// Secure: PUBLIC_URL is https; cookies are Secure and __Host-.
	Secure bool
	Log    *slog.Logger
	Now    func() time.Time
}

// Console is the console's handler, mounted at /console.
type Console struct {
	d     Deps
	mux   *http.ServeMux
	pages map[string]*template.Template
	// Login tries are limited by form, so that one cannot be replayed to
	// try keys, and by client address, so that every try cannot make its
	// own form (stricter than the server's limit: each key costs a check).
	tries   *ratelimit.Limits[string]
	addrs   *ratelimit.Limits[string]
	tooMany []byte // the 429 page, rendered once
}

//go:embed assets
var assets embed.FS

const (
	sessionLifetime = 8 * time.Hour // how long a login lasts
	pageSize        = 50            // connections a page lists
	maxLoginTries   = 5             // per login form, and one more each 10 minutes
	loginBurst      = 10            // per client address, and one more each second
)

// New builds the console.
func New(d Deps) *Console {
	d.Log = cmp.Or(d.Log, slog.Default())
	if d.Now == nil {
		d.Now = time.Now
	}
	c := &Console{d: d, mux: http.NewServeMux(), pages: parsePages(),
		tries: ratelimit.New[string](rate.Every(10*time.Minute), maxLoginTries, 0, 0),
		addrs: ratelimit.New[string](1, loginBurst, 0, 0)}
	var buf bytes.Buffer
	const status = http.StatusTooManyRequests
	_ = c.pages["error"].ExecuteTemplate(&buf, "layout", map[string]any{"Nav": "", "Status": status,
		"StatusText": http.StatusText(status), "Message": "Too many requests from your address; wait a moment (Retry-After says how long) and try again."})
	c.tooMany = buf.Bytes()
	static, _ := fs.Sub(assets, "assets")
	c.mux.Handle("GET /console/static/", http.StripPrefix("/console/static/", http.FileServerFS(static)))
	home := http.RedirectHandler("/console/connections", http.StatusSeeOther)
	c.mux.Handle("GET /console", home)
	c.mux.Handle("GET /console/{$}", home)
	c.mux.HandleFunc("GET /console/login", func(w http.ResponseWriter, r *http.Request) { c.showLogin(w, r, http.StatusOK, "") })
	c.mux.HandleFunc("POST /console/login", c.login)
	for _, a := range c.actions() {
		c.mux.Handle(a.pattern, c.session(a.scope, a.handle))
	}
	return c
}

// action is a page or form behind a session, and the scope its key needs (Permit decides).
type action struct {
	pattern string
	scope   domain.Scope
	handle  http.HandlerFunc
}

// actions are a table, so that a test can walk every one.
func (c *Console) actions() []action {
	return []action{
		{"POST /console/logout", domain.ScopeAdmin, c.logout},
		{"GET /console/connections", domain.ScopeAdmin, c.connections},
		{"GET /console/connections/{name}", domain.ScopeAdmin, c.withConn(c.connection)},
		{"POST /console/connections/{name}/reconnect", domain.ScopeAdmin, c.withConn(c.reconnect)},
		{"POST /console/connections/{name}/reactivate", domain.ScopeAdmin, c.reactivate},
		{"GET /console/connections/{name}/disconnect", domain.ScopeAdmin, c.withConn(c.confirmDisconnect)},
		{"POST /console/connections/{name}/disconnect", domain.ScopeAdmin, c.disconnect},
		{"GET /console/providers", domain.ScopeAdmin, c.providers},
	}
}

// csp allows the console's own stylesheet and forms, nothing else.
const csp = "default-src 'self'; script-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	pageHeaders(w)
	if strings.HasPrefix(r.URL.Path, "/console/static/") {
		w.Header().Del("Cache-Control")
	}
	c.mux.ServeHTTP(w, r)
}

// TooManyRequests is the page for a request the server's limits refused
// (Retry-After set): prerendered, reading nothing, so a flood costs little.
func (c *Console) TooManyRequests(w http.ResponseWriter, _ *http.Request) {
	pageHeaders(w)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(c.tooMany)
}

func pageHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Security-Policy", csp)
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
}

// cookieName: over https the __Host- prefix pins it to this origin.
func (c *Console) cookieName(base string) string {
	if c.d.Secure {
		return "__Host-" + base
	}
	return base
}

const (
	sessionCookie = "tokenguard_console"
	loginCookie   = "tokenguard_console_login"
)

func (c *Console) setCookie(w http.ResponseWriter, base, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{Name: c.cookieName(base), Value: value, Path: "/", MaxAge: maxAge,
		HttpOnly: true, Secure: c.d.Secure, SameSite: http.SameSiteStrictMode})
}

// csrfOf is the forms' CSRF token for a session (or pre-login) secret,
// which another origin can neither read nor compute.
func csrfOf(secret string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte("tokenguard console csrf"))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func csrfOK(r *http.Request, secret string) bool {
	got := r.PostFormValue("csrf")
	return got != "" && hmac.Equal([]byte(got), []byte(csrfOf(secret)))
}

type sessionKey struct{}

type current struct {
	domain.KeyAccess // the session's key
	token            domain.Secret
	CSRF             string
}

func sessionOf(r *http.Request) current {
	s, _ := r.Context().Value(sessionKey{}).(current)
	return s
}

// session answers only a live session (else the login form, or 401 for a post) whose key may use
// scope on the path's connection, and POSTs only with its CSRF token (else 403).
func (c *Console) session(scope domain.Scope, next http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ck, err := r.Cookie(c.cookieName(sessionCookie))
		var s domain.KeyAccess
		if err == nil && domain.WellFormed(ck.Value, domain.ConsolePrefix) {
			s, err = c.d.Sessions.Lookup(r.Context(), domain.NewSecret(ck.Value))
		} else {
			err = domain.ErrUnauthorized
		}
		switch {
		case errors.Is(err, domain.ErrUnauthorized):
			if r.Method == http.MethodGet {
				http.Redirect(w, r, "/console/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			c.fail(w, r, http.StatusUnauthorized, "Your session has ended. Log in again.")
			return
		case err != nil:
			c.unavailable(w, r, "console session check failed", err)
			return
		}
		cur := current{KeyAccess: s, token: domain.NewSecret(ck.Value), CSRF: csrfOf(ck.Value)}
		r = r.WithContext(context.WithValue(r.Context(), sessionKey{}, cur))
		if r.Method == http.MethodPost && !csrfOK(r, ck.Value) {
			c.fail(w, r, http.StatusForbidden, "This form is stale or did not come from the console (CSRF token missing or wrong). Reload the page and try again.")
			return
		}
		if err := s.Permit(scope, r.PathValue("name")); err != nil {
			c.failed(w, r, r.PathValue("name"), err)
			return
		}
		next(w, r)
	})
}

func (c *Console) unavailable(w http.ResponseWriter, r *http.Request, msg string, err error) {
	c.d.Log.Error(msg, "err", err)
	c.fail(w, r, http.StatusServiceUnavailable, "The database did not answer; try again.")
}

func (c *Console) showLogin(w http.ResponseWriter, r *http.Request, status int, problem string) {
	pre := rand.Text()
	c.setCookie(w, loginCookie, pre, 600)
	c.render(w, r, status, "login", map[string]any{"Nav": "", "CSRF": csrfOf(pre), "Next": safeNext(r.FormValue("next")), "Problem": problem})
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if wait := c.addrs.Take(ratelimit.ClientAddr(r), c.d.Now()); wait > 0 {
		ratelimit.SetRetryAfter(w, wait)
		c.TooManyRequests(w, r)
		return
	}
	pre, err := r.Cookie(c.cookieName(loginCookie))
	if err != nil || !csrfOK(r, pre.Value) {
		c.fail(w, r, http.StatusForbidden, "The login form is stale or did not come from the console (CSRF token missing or wrong). Open the login page again.")
		return
	}
	form := sha256.Sum256([]byte(pre.Value)) // a bounded key
	if c.tries.Take(string(form[:]), c.d.Now()) > 0 {
		c.showLogin(w, r, http.StatusTooManyRequests, "Too many attempts with this form; wait and try again.")
		return
	}
	key := strings.TrimSpace(r.PostFormValue("key"))
	if key == "" || len(key) > 512 {
		c.showLogin(w, r, http.StatusUnauthorized, "Enter an API key.")
		return
	}
	access, err := c.d.Keys.Verify(r.Context(), domain.NewSecret(key))
	switch {
	case errors.Is(err, domain.ErrUnauthorized):
		c.showLogin(w, r, http.StatusUnauthorized, "That API key is not valid.")
		return
	case err != nil:
		c.unavailable(w, r, "console login: key check failed", err)
		return
	}
	if access.Permit(domain.ScopeAdmin, "") != nil { // each page checks the session's key again
		c.showLogin(w, r, http.StatusForbidden, "That API key may not use the console: it needs the admin scope.")
		return
	}
	token, expires, err := c.d.Sessions.Create(r.Context(), access.ID, sessionLifetime)
	if err != nil {
		c.unavailable(w, r, "console login: session not stored", err)
		return
	}
	c.setCookie(w, loginCookie, "", -1)
	c.setCookie(w, sessionCookie, token.Reveal(), int(time.Until(expires).Seconds()))
	c.d.Log.Info("console login", "api_key", access.Name, "expires_at", expires)
	http.Redirect(w, r, safeNext(r.PostFormValue("next")), http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	s := sessionOf(r)
	if err := c.d.Sessions.Delete(r.Context(), s.token); err != nil {
		c.d.Log.Error("console logout: session not deleted", "err", err)
		c.fail(w, r, http.StatusServiceUnavailable, "The session could not be ended; try again.")
		return
	}
	c.setCookie(w, sessionCookie, "", -1)
	c.d.Log.Info("console logout", "api_key", s.Name)
	http.Redirect(w, r, "/console/login", http.StatusSeeOther)
}

// safeNext keeps a post-login redirect inside the console.
func safeNext(next string) string {
	if strings.HasPrefix(next, "/console/") && !strings.HasPrefix(next, "/console//") && !strings.ContainsAny(next, "\\\r\n") {
		return next
	}
	return "/console/connections"
}
