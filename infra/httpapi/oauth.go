package httpapi

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/usecase"
)

// The flow cookie only points at the flow kept in the database. Over https
// it carries the __Host- prefix: Secure, Path=/ and no Domain, so no other
// host (a sibling subdomain) can set or overwrite it.
const (
	flowCookie       = "tokenguard_flow"
	secureFlowCookie = "__Host-tokenguard_flow"
)

// callbackTimeout bounds the work after the provider's redirect: the code
// exchange, the user-info request and the write. It does not follow the
// browser: a closed tab must not lose a grant the provider has issued.
const callbackTimeout = 30 * time.Second

func (s *Server) oauthConfigured() bool {
	c := s.deps.OAuth
	return c != nil && c.Endpoint.AuthURL != "" && c.RedirectURL != "" && c.Endpoint.TokenURL != "" && s.deps.Sessions != nil
}

// secureCookies: the flow cookie is Secure (and __Host-) whenever the
// browser reaches this server over https, at PUBLIC_URL or at the
// redirect URL the provider sends it back to.
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
		return secureFlowCookie
	}
	return flowCookie
}

// sessionRequest is the body of POST /connect-sessions.
type sessionRequest struct {
	Connection         string `json:"connection"`
	ReturnTo           string `json:"return_to,omitempty"`
	AllowAccountChange bool   `json:"allow_account_change,omitempty"`
	// Provider names the connection's provider; "" the environment's.
	Provider string `json:"provider,omitempty"`
	// Metadata (a JSON object) and Tags replace the connection's when the
	// consent completes; with neither, the connection keeps its own.
	Metadata json.RawMessage `json:"metadata,omitempty"`
	Tags     []string        `json:"tags,omitempty"`
}

// createSession answers a connect URL for one connection, valid once for
// ten minutes.
func (s *Server) createSession(w http.ResponseWriter, r *http.Request) {
	if !s.oauthConfigured() {
		writeJSON(w, http.StatusServiceUnavailable, errorBody{
			Error: "the connect flow needs OAUTH_AUTH_URL, OAUTH_TOKEN_URL and OAUTH_REDIRECT_URL", Code: "not_configured"})
		return
	}
	var req sessionRequest
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, errorBody{Error: `want a JSON body {"connection":"NAME"} (optional: "return_to", "allow_account_change", "provider", "metadata", "tags")`, Code: "bad_request"})
		return
	}
	if err := domain.ValidateName(req.Connection); err != nil {
		writeError(w, "", err)
		return
	}
	// Which keys may ask for a link, and for which account change.
	acc := keyAccess(r.Context())
	if !allowConnection(w, acc, req.Connection) ||
		(req.AllowAccountChange && !allowScope(w, acc, domain.ScopeAdmin, "allow_account_change")) {
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
	if _, err := s.clientOf(r.Context(), req.Provider); err != nil {
		if !errors.Is(err, domain.ErrUnknownProvider) {
			s.logFailure(r, req.Connection, err)
		}
		writeError(w, req.Connection, err)
		return
	}
	if req.ReturnTo != "" && !returnAllowed(req.ReturnTo, s.deps.Edges.ReturnURLs) {
		writeJSON(w, http.StatusBadRequest, errorBody{Error: "return_to is not in CONNECT_RETURN_URLS", Code: "return_to_not_allowed", Connection: req.Connection})
		return
	}
	keyName := keyName(r.Context())
	token, expires, err := s.deps.Sessions.Create(r.Context(), domain.ConnectSession{
		Connection: req.Connection, ReturnTo: req.ReturnTo, AllowAccountChange: req.AllowAccountChange, CreatedBy: keyName,
		Provider: req.Provider, Metadata: metadata,
	})
	if err != nil {
		s.logFailure(r, req.Connection, err)
		writeError(w, req.Connection, err)
		return
	}
	s.deps.Log.Info("connect session created", "connection", req.Connection, "api_key", keyName,
		"allow_account_change", req.AllowAccountChange, "expires_at", expires)
	writeJSON(w, http.StatusCreated, map[string]any{
		"connect_url": s.publicBase() + "/oauth/connect?session=" + url.QueryEscape(token.Reveal()),
		"expires_at":  expires.UTC(),
		"connection":  req.Connection,
	})
}

// publicBase is PUBLIC_URL without a trailing slash, else the redirect
// URL's origin.
func (s *Server) publicBase() string {
	if u := s.deps.Edges.PublicURL; u != nil {
		return strings.TrimSuffix(u.String(), "/")
	}
	if u, err := url.Parse(s.deps.OAuth.RedirectURL); err == nil {
		return u.Scheme + "://" + u.Host
	}
	return ""
}

// returnAllowed reports whether target starts with one of the allowed
// URLs: same scheme and host, and a path at or under the allowed one. A
// target a browser could read as another path is refused before the
// comparison: dot segments (plain or percent-encoded, however often),
// encoded slashes, backslashes and control characters.
func returnAllowed(target string, allowed []string) bool {
	if !plainURL(target) {
		return false
	}
	t, err := url.Parse(target)
	if err != nil || (t.Scheme != "https" && t.Scheme != "http") || t.Host == "" || t.User != nil || t.Fragment != "" {
		return false
	}
	for _, a := range allowed {
		u, err := url.Parse(a)
		if err != nil || !strings.EqualFold(u.Scheme, t.Scheme) || !strings.EqualFold(u.Host, t.Host) {
			continue
		}
		base := strings.TrimSuffix(u.Path, "/")
		if t.Path == u.Path || base == "" || t.Path == base || strings.HasPrefix(t.Path, base+"/") {
			return true
		}
	}
	return false
}

// plainURL: no backslash, no control or non-ASCII byte, no encoded
// slash or backslash, and no path segment that decodes (repeatedly) to
// "." or "..".
func plainURL(target string) bool {
	for i := 0; i < len(target); i++ {
		if c := target[i]; c < 0x21 || c > 0x7e || c == '\\' {
			return false
		}
	}
	path, _, _ := strings.Cut(target, "?")
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
	return true
}

// connect spends a connect session and sends the browser to the provider.
func (s *Server) connect(w http.ResponseWriter, r *http.Request) {
	if !s.oauthConfigured() {
		s.page(w, r, http.StatusServiceUnavailable, outcome{Code: "not_configured", Message: "The connect flow is not configured on this server."})
		return
	}
	token := r.URL.Query().Get("session")
	if !strings.HasPrefix(token, "tgs_") || len(token) > 128 {
		s.page(w, r, http.StatusUnauthorized, outcome{Code: "unauthorized", Message: "This link is not a valid connect link. Ask for a new one."})
		return
	}
	state, verifier, flow := rand.Text(), oauth2.GenerateVerifier(), newFlowID()
	sess, err := s.deps.Sessions.Open(r.Context(), domain.NewSecret(token), flow, state, verifier)
	if errors.Is(err, domain.ErrUnauthorized) {
		s.deps.Log.Info("connect link refused: unknown, used or expired session")
		s.page(w, r, http.StatusUnauthorized, outcome{Code: "unauthorized", Message: "This connect link was already used or has expired. Ask for a new one."})
		return
	}
	if err != nil {
		s.logFailure(r, "", err)
		s.page(w, r, classify(err).status, outcome{Code: classify(err).code, Message: "The server could not start the connection; try again."})
		return
	}
	http.SetCookie(w, &http.Cookie{
		Name:     s.cookieName(),
		Value:    flow.Reveal(),
		Path:     "/",
		MaxAge:   int(sessionLifetime.Seconds()),
		HttpOnly: true,
		Secure:   s.secureCookies(),
		SameSite: http.SameSiteLaxMode, // sent on the provider's top-level redirect back
	})
	client, err := s.clientOf(r.Context(), sess.Provider)
	if err != nil {
		s.logFailure(r, sess.Connection, err)
		s.page(w, r, classify(err).status, outcome{Code: classify(err).code, Message: "The connection's provider is not known to this server."})
		return
	}
	s.deps.Log.Info("connect flow started", "connection", sess.Connection, "provider", sess.Provider)
	w.Header().Set("Cache-Control", "no-store")
	opts := []oauth2.AuthCodeOption{oauth2.S256ChallengeOption(verifier)}
	if s.deps.Exchanger != nil {
		opts = append(opts, s.deps.Exchanger.AuthCodeOptions(sess.Provider, client.Scopes)...)
	}
	http.Redirect(w, r, client.AuthCodeURL(state, opts...), http.StatusFound)
}

// clientOf is the client registration the browser flow of a connection of
// provider runs with: the OAUTH_* settings' for "", a stored provider's
// otherwise, always with this server's redirect URL.
func (s *Server) clientOf(ctx context.Context, provider string) (*oauth2.Config, error) {
	if provider == "" {
		return s.deps.OAuth, nil
	}
	if s.deps.Providers == nil {
		return nil, fmt.Errorf("provider %q: %w", provider, domain.ErrUnknownProvider)
	}
	c, err := s.deps.Providers.ClientConfig(ctx, provider)
	if err != nil {
		return nil, err
	}
	if c.Endpoint.AuthURL == "" {
		return nil, fmt.Errorf("provider %q has no authorization URL (tokenctl provider update --auth-url): %w", provider, domain.ErrUnknownProvider)
	}
	c.RedirectURL = s.deps.OAuth.RedirectURL
	return c, nil
}

// sessionLifetime is the flow's lifetime (repository.SessionLifetime).
const sessionLifetime = 10 * time.Minute

// callback checks the flow, redeems the code and stores the grant.
func (s *Server) callback(w http.ResponseWriter, r *http.Request) {
	if !s.oauthConfigured() {
		s.page(w, r, http.StatusServiceUnavailable, outcome{Code: "not_configured", Message: "The connect flow is not configured on this server."})
		return
	}
	// Whatever happens, the flow is single-use.
	http.SetCookie(w, &http.Cookie{Name: s.cookieName(), Path: "/", MaxAge: -1, HttpOnly: true, Secure: s.secureCookies(), SameSite: http.SameSiteLaxMode})
	c, err := r.Cookie(s.cookieName())
	if err != nil || !strings.HasPrefix(c.Value, "tgf_") || len(c.Value) > 128 {
		s.page(w, r, http.StatusBadRequest, outcome{Code: "bad_state", Message: "No connection is in progress in this browser (the link expired, or cookies are blocked). Start again from a new connect link."})
		return
	}
	// From here on the work does not follow the browser.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), callbackTimeout)
	defer cancel()
	sess, err := s.deps.Sessions.Finish(ctx, domain.NewSecret(c.Value))
	if errors.Is(err, domain.ErrUnauthorized) {
		s.page(w, r, http.StatusBadRequest, outcome{Code: "bad_state", Message: "This connection attempt was already completed or has expired. Start again from a new connect link."})
		return
	}
	if err != nil {
		s.logFailure(r, "", err)
		s.page(w, r, classify(err).status, outcome{Code: classify(err).code, Message: "The server could not complete the connection; try again."})
		return
	}
	o := s.complete(ctx, r.URL.Query(), sess)
	o.Connection = sess.Connection
	if s.deps.Observer != nil {
		s.deps.Observer.ConnectOutcome(o.Code)
	}
	if sess.ReturnTo != "" {
		// "reason", not "code": an application's OAuth callback may take
		// a "code" for an authorization code.
		q := url.Values{"connection": {sess.Connection}, "status": {o.status()}, "reason": {o.Code}}
		sep := "?"
		if strings.Contains(sess.ReturnTo, "?") {
			sep = "&"
		}
		w.Header().Set("Cache-Control", "no-store")
		http.Redirect(w, r, sess.ReturnTo+sep+q.Encode(), http.StatusSeeOther)
		return
	}
	s.page(w, r, o.httpStatus, o)
}

// complete turns the provider's redirect into a stored grant, or says why
// not.
func (s *Server) complete(ctx context.Context, q url.Values, sess domain.ConnectSession) outcome {
	name := sess.Connection
	if subtle.ConstantTimeCompare([]byte(q.Get("state")), []byte(sess.State)) != 1 {
		s.deps.Log.Warn("oauth callback with a wrong state", "connection", name)
		return outcome{httpStatus: http.StatusBadRequest, Code: "bad_state", Message: "The answer from the provider does not belong to this connection attempt. Start again from a new connect link."}
	}
	if e := q.Get("error"); e != "" {
		code := oauthCode(e)
		s.deps.Log.Info("the provider refused the authorization", "connection", name, "reason", code)
		return outcome{httpStatus: http.StatusBadRequest, Code: code, Message: "The provider did not grant access (" + code + ")."}
	}
	code := q.Get("code")
	if code == "" {
		return outcome{httpStatus: http.StatusBadRequest, Code: "bad_request", Message: "The provider sent no authorization code."}
	}
	client, err := s.clientOf(ctx, sess.Provider)
	if err != nil {
		s.deps.Log.Error("the connection's provider is not known to this server; nothing stored", "connection", name, "err", err)
		return outcome{httpStatus: http.StatusBadRequest, Code: "unknown_provider", Message: "The connection's provider is not known to this server; nothing was stored."}
	}
	exCtx := context.WithValue(ctx, oauth2.HTTPClient, s.deps.OAuthHTTP)
	var tok *oauth2.Token
	var grant domain.Grant
	if s.deps.Exchanger != nil {
		grant, tok, err = s.deps.Exchanger.Exchange(exCtx, sess.Provider, code, client.RedirectURL, sess.Verifier)
	} else if tok, err = client.Exchange(exCtx, code, oauth2.VerifierOption(sess.Verifier)); err == nil {
		grant = provider.GrantFrom(tok)
	}
	if err != nil {
		// Never log err itself: a RetrieveError prints the response body.
		var re *oauth2.RetrieveError
		var pe *domain.ProviderError
		reason := "no answer"
		switch {
		case errors.As(err, &re):
			reason = oauthCode(re.ErrorCode)
		case errors.As(err, &pe) && pe.Code != "":
			reason = oauthCode(pe.Code)
		}
		s.deps.Log.Warn("code exchange failed", "connection", name, "reason", reason)
		return outcome{httpStatus: http.StatusBadGateway, Code: "exchange_failed", Message: "The provider did not redeem the authorization (" + reason + ")."}
	}
	accounts := s.deps.Account
	if sess.Provider != "" {
		// The user-info URL is the OAUTH_* provider's: another provider's
		// token never goes there. Its ID token, if any, names the account.
		accounts = AccountSource{HTTP: accounts.HTTP}
	}
	account, err := accounts.Account(exCtx, tok)
	if err != nil {
		s.deps.Log.Warn("the account that granted the connection is unknown; nothing stored", "connection", name, "err", err)
		return outcome{httpStatus: http.StatusBadGateway, Code: "account_unknown", Message: "The provider did not say which account granted access; nothing was stored."}
	}
	granted := grantedScopes(tok, client.Scopes)
	var missing []string
	for _, want := range client.Scopes {
		if !slices.Contains(granted, want) {
			missing = append(missing, want)
		}
	}
	b := domain.Binding{Account: account, Scopes: strings.Join(granted, " "), MissingScopes: strings.Join(missing, " ")}
	var fields map[string]string
	if s.deps.Exchanger != nil {
		fields = s.deps.Exchanger.ProviderFields(sess.Provider, q, grant)
	}
	t, err := s.deps.Connector.ConnectGrant(ctx, name, grant, usecase.ConnectRequest{
		Binding: b, AllowAccountChange: sess.AllowAccountChange, Metadata: sess.Metadata, Provider: sess.Provider,
		ProviderFields: fields})
	switch {
	case errors.Is(err, domain.ErrAccountMismatch):
		s.deps.Log.Warn("grant refused: another provider account than the connection's; nothing stored",
			"connection", name, "account", account, "session_by", sess.CreatedBy)
		return outcome{httpStatus: http.StatusConflict, Code: "account_mismatch",
			Message: "This connection belongs to another account at the provider. Nothing was changed. To move it to this account, ask for a connect link that allows an account change."}
	case errors.Is(err, domain.ErrInvalidToken):
		s.deps.Log.Warn("the provider granted no usable token", "connection", name, "err", err)
		return outcome{httpStatus: http.StatusBadGateway, Code: "exchange_failed", Message: "The provider granted no usable token (no refresh token?)."}
	case err != nil:
		p := classify(err)
		s.deps.Log.Error("storing the grant failed", "connection", name, "err", err)
		return outcome{httpStatus: p.status, Code: p.code, Message: "The grant could not be stored; try again."}
	}
	if len(missing) > 0 {
		s.deps.Log.Warn("connection connected with fewer scopes than requested", "token", t,
			"granted", granted, "missing", missing)
		return outcome{httpStatus: http.StatusOK, Code: "scopes_narrowed", connected: true,
			Message: "Connected, but without: " + strings.Join(missing, ", ") + ". Some features may not work."}
	}
	s.deps.Log.Info("connection connected", "token", t, "account", account, "scopes", granted)
	return outcome{httpStatus: http.StatusOK, Code: "connected", connected: true, Message: "Connected. You can close this window."}
}

// grantedScopes is the token response's scope, or what was requested when
// the provider sent none (RFC 6749 §5.1: then it granted what was asked).
func grantedScopes(tok *oauth2.Token, requested []string) []string {
	if s, ok := tok.Extra("scope").(string); ok {
		return strings.Fields(strings.ReplaceAll(s, ",", " "))
	}
	return slices.Clone(requested)
}

// newFlowID is the flow cookie's value.
func newFlowID() domain.Secret {
	return domain.NewSecret("tgf_" + rand.Text() + rand.Text())
}

// oauthCode keeps an OAuth2 error code printable and short: it comes from
// outside.
func oauthCode(s string) string {
	if len(s) > 64 {
		s = s[:64]
	}
	out := []byte(s)
	for i, b := range out {
		if (b < 'a' || b > 'z') && (b < 'A' || b > 'Z') && (b < '0' || b > '9') && b != '_' && b != '-' && b != '.' {
			out[i] = '?'
		}
	}
	if len(out) == 0 {
		return "unknown"
	}
	return string(out)
}
