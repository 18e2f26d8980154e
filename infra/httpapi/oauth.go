package httpapi

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode"

	"github.com/tokenguard/tokenguard"
	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/httpapi/problem"
)

const (
	// flowCookie names the flow kept in the database; over https, __Host- bars sibling hosts from it.
	flowCookie = "tokenguard_flow"
	// callbackTimeout bounds the work after the provider's redirect, apart
	// from the browser: a closed tab must not lose an issued grant.
	callbackTimeout = 30 * time.Second
	sessionLifetime = 10 * time.Minute // the flow's (repository.SessionLifetime)
)

func (s *Server) oauthConfigured() bool {
	c := s.deps.OAuth
	return c != nil && c.Endpoint.AuthURL != "" && c.RedirectURL != "" && c.Endpoint.TokenURL != "" && s.deps.Sessions != nil && s.deps.Flows != nil
}

// flowConfigured answers a 503 page, not h, unless the connect flow is configured.
func (s *Server) flowConfigured(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.oauthConfigured() {
			s.page(w, r, http.StatusServiceUnavailable, outcome{Code: "not_configured", Message: "The connect flow is not configured on this server."})
			return
		}
		h(w, r)
	}
}

// failPage logs err and answers it with a page saying msg.
func (s *Server) failPage(w http.ResponseWriter, r *http.Request, name string, err error, msg string) {
	s.logFailure(r, name, err)
	p := problem.Of(err)
	s.page(w, r, p.Status, outcome{Code: p.Code, Message: msg})
}

// secureCookies: PUBLIC_URL or the redirect URL is https.
func (s *Server) secureCookies() bool {
	if u := s.deps.Edges.PublicURL; u != nil && u.Scheme == "https" {
		return true
	}
	if c := s.deps.OAuth; c != nil {
		if u, err := url.Parse(c.RedirectURL); err == nil && strings.EqualFold(u.Scheme, "https") {
			return true
		}
	}
	return false
}

func (s *Server) cookieName() string {
	if s.secureCookies() {
		return "__Host-" + flowCookie
	}
	return flowCookie
}

// createSession answers a connect URL, valid once for sessionLifetime.
func (s *Server) createSession(w http.ResponseWriter, r *http.Request) {
	if !s.oauthConfigured() {
		writeJSON(w, http.StatusServiceUnavailable, errorBody{
			Error: "the connect flow needs OAUTH_AUTH_URL, OAUTH_TOKEN_URL and OAUTH_REDIRECT_URL", Code: "not_configured"})
		return
	}
	var req struct {
		Connection         string `json:"connection"`
		ReturnTo           string `json:"return_to,omitempty"`
		AllowAccountChange bool   `json:"allow_account_change,omitempty"`
		Provider           string `json:"provider,omitempty"` // "": the environment's
		// Metadata and Tags replace the connection's at redemption, if given.
		Metadata json.RawMessage `json:"metadata,omitempty"`
		Tags     []string        `json:"tags,omitempty"`
	}
	if err := decodeBody(r, &req, false); err != nil {
		writeJSON(w, http.StatusBadRequest, errorBody{Error: `want a JSON body {"connection":"NAME","return_to":"URL"} (optional: "allow_account_change", "provider", "metadata", "tags")`, Code: "bad_request"})
		return
	}
	if err := domain.ValidateName(req.Connection); err != nil {
		writeError(w, "", err)
		return
	}
	acc := keyAccess(r.Context())
	if !permit(w, acc, domain.ScopeConnect, req.Connection, "") ||
		(req.AllowAccountChange && !permit(w, acc, domain.ScopeAdmin, "", "allow_account_change")) {
		return
	}
	var metadata *domain.Metadata
	if req.Metadata != nil || req.Tags != nil {
		m, err := domain.NewMetadata(req.Metadata, req.Tags)
		if err != nil {
			writeError(w, req.Connection, err)
			return
		}
		metadata = &m
	}
	if req.ReturnTo == "" { // after the provider: an unknown one is the first thing to fix
		if err := s.checkProvider(r.Context(), req.Provider); err != nil {
			s.failed(w, r, req.Connection, err)
			return
		}
		writeJSON(w, http.StatusBadRequest, errorBody{Error: "return_to is required: the browser brings the consent's result there, and your backend redeems it (POST /connect-results)", Code: "return_to_required", Connection: req.Connection})
		return
	}
	link, expires, err := s.newConnectLink(r.Context(), domain.ConnectSession{Connection: req.Connection, ReturnTo: req.ReturnTo,
		AllowAccountChange: req.AllowAccountChange, CreatedBy: acc.Name, Provider: req.Provider, Metadata: metadata})
	if err != nil {
		s.failed(w, r, req.Connection, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"connect_url": link, "expires_at": expires.UTC(), "connection": req.Connection})
}

// newConnectLink checks a connect session's provider and return_to, stores it and returns its URL.
func (s *Server) newConnectLink(ctx context.Context, cs domain.ConnectSession) (string, time.Time, error) {
	if err := s.checkProvider(ctx, cs.Provider); err != nil {
		return "", time.Time{}, err
	}
	if !returnAllowed(cs.ReturnTo, s.deps.Edges.ReturnURLs) {
		return "", time.Time{}, domain.ErrReturnToNotAllowed
	}
	token, expires, err := s.deps.Sessions.Create(ctx, cs)
	if err != nil {
		return "", time.Time{}, err
	}
	s.deps.Log.Info("connect session created", "connection", cs.Connection, "api_key", cs.CreatedBy,
		"allow_account_change", cs.AllowAccountChange, "expires_at", expires)
	// PUBLIC_URL (no trailing slash), else the redirect URL's origin.
	base := ""
	if u := s.deps.Edges.PublicURL; u != nil {
		base = strings.TrimSuffix(u.String(), "/")
	} else if u, err := url.Parse(s.deps.OAuth.RedirectURL); err == nil {
		base = u.Scheme + "://" + u.Host
	}
	return base + "/oauth/connect?session=" + url.QueryEscape(token.Reveal()), expires, nil
}

// ConnectLink is POST /connect-sessions for the console: a link that
// reconnects connection at provider, keeping its metadata.
func (s *Server) ConnectLink(ctx context.Context, connection, provider, createdBy, returnTo string) (string, time.Time, error) {
	if !s.oauthConfigured() {
		return "", time.Time{}, domain.ErrConnectNotConfigured
	}
	if err := domain.ValidateName(connection); err != nil {
		return "", time.Time{}, err
	}
	return s.newConnectLink(ctx, domain.ConnectSession{Connection: connection, CreatedBy: createdBy, Provider: provider, ReturnTo: returnTo})
}

// returnAllowed reports whether target is at or under one of the allowed URLs, and a browser cannot
// read it as another path: it has no backslash, control or non-ASCII byte, encoded (back)slash, or
// segment that decodes, however often, to "." or "..".
func returnAllowed(target string, allowed []string) bool {
	if strings.ContainsFunc(target, func(c rune) bool { return c < 0x21 || c > 0x7e || c == '\\' }) {
		return false
	}
	path, _, _ := strings.Cut(target, "?")
	if domain.CheckPath(path) != nil {
		return false
	}
	for seg := range strings.SplitSeq(path, "/") {
		for range 4 { // %252e%252e and deeper
			dec, err := url.PathUnescape(seg)
			if err != nil {
				return false
			}
			if dec == seg {
				break
			}
			if strings.ContainsAny(dec, "/\\") || strings.ContainsFunc(dec, unicode.IsControl) {
				return false
			}
			seg = dec
		}
		if seg == "." || seg == ".." || strings.Contains(seg, "%") {
			return false
		}
	}
	t, err := url.Parse(target)
	if err != nil || (t.Scheme != "https" && t.Scheme != "http") || t.Host == "" || t.User != nil || t.Fragment != "" {
		return false
	}
	for _, a := range allowed {
		if u, err := url.Parse(a); err == nil && under(t, u) {
			return true
		}
	}
	return false
}

// under: u has base's scheme and host, and its path is at or under base's.
func under(u, base *url.URL) bool {
	prefix := strings.TrimSuffix(base.Path, "/")
	return strings.EqualFold(u.Scheme, base.Scheme) && strings.EqualFold(u.Host, base.Host) &&
		(u.Path == prefix || strings.HasPrefix(u.Path, prefix+"/"))
}

// connectPage answers a connect link with a consent page: nothing starts until
// a person presses its button, whose CSRF token is bound to the flow cookie set here.
func (s *Server) connectPage(w http.ResponseWriter, r *http.Request) {
	token := r.URL.Query().Get("session")
	if !domain.WellFormed(token, domain.SessionPrefix) {
		s.page(w, r, http.StatusUnauthorized, outcome{Code: "unauthorized", Message: "This link is not a valid connect link. Ask for a new one."})
		return
	}
	sess, err := s.deps.Sessions.Peek(r.Context(), domain.NewSecret(token))
	if err != nil {
		s.sessionRefused(w, r, err)
		return
	}
	flow := domain.NewCredential(domain.FlowPrefix)
	s.setFlowCookie(w, flow.Reveal(), int(sessionLifetime.Seconds()))
	// Never framed (clickjacking), posting only to this origin.
	w.Header().Set("Referrer-Policy", "no-referrer")
	w.Header().Set("X-Frame-Options", "DENY")
	returnHost := ""
	if u, err := url.Parse(sess.ReturnTo); err == nil {
		returnHost = u.Host
	}
	writePage(w, http.StatusOK, "consent.html", map[string]string{"App": sess.CreatedBy, "Connection": sess.Connection,
		"Provider": sess.Provider, "Session": token, "CSRF": csrfToken(flow.Reveal(), token), "ReturnHost": returnHost},
		"; form-action 'self'; frame-ancestors 'none'")
}

// connectStart is the consent page's button: it binds the flow (cookie,
// state, PKCE verifier) to the session and redirects to the provider.
func (s *Server) connectStart(w http.ResponseWriter, r *http.Request) {
	token, csrf := r.PostFormValue("session"), r.PostFormValue("csrf")
	c, err := r.Cookie(s.cookieName())
	if err != nil || !domain.WellFormed(c.Value, domain.FlowPrefix) || !domain.WellFormed(token, domain.SessionPrefix) ||
		subtle.ConstantTimeCompare([]byte(csrf), []byte(csrfToken(c.Value, token))) != 1 {
		s.page(w, r, http.StatusForbidden, outcome{Code: "bad_csrf", Message: "This request did not come from the connect page in this browser. Open the connect link again."})
		return
	}
	sess, err := s.deps.Sessions.Peek(r.Context(), domain.NewSecret(token))
	if err != nil {
		s.sessionRefused(w, r, err)
		return
	}
	authURL, f, err := s.deps.Flows.AuthCodeURL(r.Context(), tokenguard.ConnectFlow{Connection: sess.Connection, Provider: sess.Provider, RedirectURL: s.deps.OAuth.RedirectURL})
	if err != nil {
		s.failPage(w, r, sess.Connection, err, "The server could not start the connection; try again.")
		return
	}
	if _, err := s.deps.Sessions.Open(r.Context(), domain.NewSecret(token), domain.NewSecret(c.Value), f.State, f.Verifier); err != nil {
		s.sessionRefused(w, r, err)
		return
	}
	s.deps.Log.Info("connect flow started", "connection", sess.Connection, "provider", sess.Provider, "api_key", sess.CreatedBy)
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, authURL, http.StatusSeeOther)
}

func (s *Server) sessionRefused(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, domain.ErrUnauthorized) {
		s.deps.Log.Info("connect link refused: unknown, used or expired session")
		s.page(w, r, http.StatusUnauthorized, outcome{Code: "unauthorized", Message: "This connect link was already used or has expired. Ask for a new one."})
		return
	}
	s.failPage(w, r, "", err, "The server could not start the connection; try again.")
}

// setFlowCookie sets the flow cookie ("" with maxAge -1 deletes it).
func (s *Server) setFlowCookie(w http.ResponseWriter, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{Name: s.cookieName(), Value: value, Path: "/", MaxAge: maxAge, HttpOnly: true, Secure: s.secureCookies(),
		SameSite: http.SameSiteLaxMode}) // Lax: sent on the provider's top-level redirect back
}

// csrfToken binds the consent form to the flow cookie, which no other
// site can read, and the session.
func csrfToken(flow, session string) string {
	h := sha256.Sum256([]byte("tokenguard-csrf\x00" + flow + "\x00" + session))
	return base64.RawURLEncoding.EncodeToString(h[:])
}

// checkProvider: the flow runs for "" (OAUTH_*) or a provider with an auth URL.
func (s *Server) checkProvider(ctx context.Context, provider string) error {
	if provider == "" {
		return nil
	}
	if s.deps.Providers == nil {
		return fmt.Errorf("provider %q: %w", provider, domain.ErrUnknownProvider)
	}
	c, err := s.deps.Providers.ClientConfig(ctx, provider)
	if err == nil && c.Endpoint.AuthURL == "" {
		err = fmt.Errorf("provider %q has no authorization URL (tokenctl provider update --auth-url): %w", provider, domain.ErrUnknownProvider)
	}
	return err
}

// callback checks the flow and its state, then keeps the grant pending
// until the backend redeems the result sent to return_to.
func (s *Server) callback(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	c, err := r.Cookie(s.cookieName())
	state := q.Get("state")
	if err != nil || !domain.WellFormed(c.Value, domain.FlowPrefix) || state == "" || len(state) > 256 {
		s.page(w, r, http.StatusBadRequest, outcome{Code: "bad_state", Message: "No connection is in progress in this browser (the link expired, or cookies are blocked). Start again from a new connect link."})
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), callbackTimeout)
	defer cancel()
	// An answer with another state leaves the flow unspent.
	sess, err := s.deps.Sessions.Finish(ctx, domain.NewSecret(c.Value), state)
	if errors.Is(err, domain.ErrUnauthorized) {
		s.deps.Log.Warn("oauth callback refused: no flow with this cookie and state (completed, expired, or a forged answer)")
		s.observe("bad_state")
		s.page(w, r, http.StatusBadRequest, outcome{Code: "bad_state", Message: "This connection attempt was already completed or has expired, or the answer does not belong to it. Start again from a new connect link."})
		return
	}
	if err != nil {
		s.failPage(w, r, "", err, "The server could not complete the connection; try again.")
		return
	}
	s.setFlowCookie(w, "", -1)
	f := tokenguard.ConnectFlow{Connection: sess.Connection, Provider: sess.Provider, RedirectURL: s.deps.OAuth.RedirectURL,
		AllowAccountChange: sess.AllowAccountChange, CreatedBy: sess.CreatedBy, State: sess.State, Verifier: sess.Verifier}
	if m := sess.Metadata; m != nil {
		f.Metadata, f.Tags = m.Object, nonNil(m.Tags)
	}
	// The provider's answer becomes a pending result, or says why not.
	var o outcome
	res, err := s.deps.Flows.Complete(ctx, f, q)
	var ce *tokenguard.ConnectError
	switch {
	case errors.As(err, &ce):
		s.deps.Log.Warn("connect flow ended without a grant; nothing stored", "connection", f.Connection, "reason", ce.Code)
		o = outcome{Code: ce.Code}
	case err != nil:
		s.deps.Log.Error("keeping the grant failed", "connection", f.Connection, "err", err)
		o = outcome{Code: problem.Of(err).Code}
	default:
		s.deps.Log.Info("consent received; the grant waits for the application's redemption", "connection", f.Connection,
			"account", res.Account, "scopes", res.Scopes, "expires_at", res.ExpiresAt)
		o = outcome{Code: "pending", result: res.Code}
	}
	s.observe(o.Code)
	if ControlBuild && o.result != "" {
		o = s.redeemAtCallback(ctx, o)
	}
	if sess.ReturnTo == "" {
		s.page(w, r, http.StatusConflict, outcome{Connection: sess.Connection, Code: "no_return_to",
			Message: "This connect link has no return address, so the application cannot complete the connection; nothing was stored. Ask the application for a new link."})
		return
	}
	// "reason", not "code": an OAuth callback may take that for its own.
	v := url.Values{"connection": {sess.Connection}, "status": {"error"}, "reason": {o.Code}}
	switch {
	case o.result != "":
		v = url.Values{"connection": {sess.Connection}, "status": {"pending"}, "result": {o.result}}
	case o.Connected: // only the control build
		v.Set("status", "connected")
	}
	sep := "?"
	if strings.Contains(sess.ReturnTo, "?") {
		sep = "&"
	}
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Referrer-Policy", "no-referrer")
	http.Redirect(w, r, sess.ReturnTo+sep+v.Encode(), http.StatusSeeOther)
}

// redeem stores the grant of a pending result, once the backend has
// checked that the browser which brought it is its user's.
func (s *Server) redeem(w http.ResponseWriter, r *http.Request) {
	if s.deps.Flows == nil {
		writeJSON(w, http.StatusServiceUnavailable, errorBody{Error: "the connect flow is not configured", Code: "not_configured"})
		return
	}
	var req struct {
		Result string `json:"result"`
	}
	if err := decodeBody(r, &req, false); err != nil || req.Result == "" {
		writeJSON(w, http.StatusBadRequest, errorBody{Error: `want a JSON body {"result":"tgr_…"}`, Code: "bad_request"})
		return
	}
	// Checked before anything is stored: a refused result stays redeemable.
	acc := keyAccess(r.Context())
	c, err := s.deps.Flows.RedeemFor(r.Context(), req.Result, func(connection string) error {
		return acc.Permit(domain.ScopeConnect, connection)
	})
	switch {
	case errors.Is(err, domain.ErrConnectionNotAllowed):
		s.deps.Log.Warn("connect result refused: the API key may not connect its connection; nothing stored",
			"connection", c.Connection, "api_key", acc.Name)
		permit(w, acc, domain.ScopeConnect, c.Connection, "")
		return
	case errors.Is(err, domain.ErrAccountMismatch):
		s.observe("account_mismatch")
		s.deps.Log.Warn("grant refused: another provider account than the connection's; nothing stored, the grant is revoked",
			"connection", c.Connection, "api_key", acc.Name)
		writeError(w, c.Connection, err)
		return
	case err != nil:
		s.failed(w, r, c.Connection, err)
		return
	}
	s.redeemed(r.Context(), c)
	writeJSON(w, http.StatusOK, map[string]any{"connection": c.Connection, "account": c.Account,
		"scopes": nonNil(c.Scopes), "missing_scopes": nonNil(c.MissingScopes)})
}

func (s *Server) redeemed(ctx context.Context, c tokenguard.Connected) {
	if len(c.MissingScopes) > 0 {
		s.observe("scopes_narrowed")
	} else {
		s.observe("connected")
	}
	s.deps.Log.Info("connection connected", "connection", c.Connection, "provider", c.Provider, "account", c.Account,
		"scopes", c.Scopes, "missing_scopes", c.MissingScopes, "api_key", keyAccess(ctx).Name)
}

func (s *Server) observe(outcome string) {
	if s.deps.Observer != nil {
		s.deps.Observer.ConnectOutcome(outcome)
	}
}

// outcome is how a browser flow ended: a small page, or a return_to redirect.
type outcome struct {
	Connected  bool // redirected only, in the control build
	Connection string
	Code       string // pending, or what went wrong
	Message    string // for people; never a token
	result     string // the pending result's code (a secret): only ever in return_to
}

//go:embed outcome.html consent.html
var pageFiles embed.FS

var pages = template.Must(template.ParseFS(pageFiles, "*.html"))

// page answers a browser with a small HTML page, other clients in JSON.
func (s *Server) page(w http.ResponseWriter, r *http.Request, status int, o outcome) {
	if !strings.Contains(r.Header.Get("Accept"), "text/html") {
		writeJSON(w, status, errorBody{Error: o.Message, Code: o.Code, Connection: o.Connection})
		return
	}
	writePage(w, status, "outcome.html", o, "")
}

// writePage writes the page name, whose only allowed source beside csp is its inline style.
func writePage(w http.ResponseWriter, status int, name string, data any, csp string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'"+csp)
	w.WriteHeader(status)
	_ = pages.ExecuteTemplate(w, name, data)
}
