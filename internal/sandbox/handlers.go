package sandbox

import (
	"cmp"
	"context"
	"encoding/json"
	"maps"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"time"

	"github.com/ory/fosite"
)

// Handler serves the provider:
//
//	POST /oauth2/token  authorization_code and refresh_token grants
//	                    (at /t/{tenant}/oauth2/token with Options.Tenant)
//	POST /oauth2/revoke token revocation (RFC 7009)
//	GET  /oauth2/auth   authorization endpoint (auto-approves)
//	GET  /resource      protected API, requires a Bearer access token, or
//	                    a DPoP-bound one with a proof of its key (dpop.go)
//	GET  /userinfo      {"sub": …} of a Bearer access token's subject
//	GET  /stats         Stats as JSON
func (p *Provider) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /oauth2/token", func(w http.ResponseWriter, r *http.Request) {
		if p.tenant != "" {
			http.NotFound(w, r) // only the tenant's URL is a token endpoint
			return
		}
		p.handleToken(w, r)
	})
	mux.HandleFunc("POST /t/{tenant}/oauth2/token", func(w http.ResponseWriter, r *http.Request) {
		if p.tenant == "" || r.PathValue("tenant") != p.tenant {
			http.NotFound(w, r)
			return
		}
		p.handleToken(w, r)
	})
	mux.HandleFunc("POST /oauth2/revoke", p.handleRevoke)
	mux.HandleFunc("GET /oauth2/auth", p.handleAuthorize)
	mux.HandleFunc("GET /resource", p.handleResource)
	mux.HandleFunc("GET /userinfo", p.handleUserInfo)
	mux.HandleFunc("GET /stats", p.handleStats)
	return mux
}

func (p *Provider) handleAuthorize(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	if p.store.anyRedirect {
		ctx = context.WithValue(ctx, redirectKey{}, r.URL.Query().Get("redirect_uri"))
	}
	ar, err := p.oauth.NewAuthorizeRequest(ctx, r)
	if err != nil {
		p.oauth.WriteAuthorizeError(ctx, w, ar, err)
		return
	}
	if r.URL.Query().Get("prompt") == "consent" {
		p.stats.consentPrompts.Add(1)
	}
	// Auto-approve. fosite has already checked the requested scopes and
	// audience against what the client is allowed. The person consenting
	// is login_hint (default Subject), and consent_scope, when present,
	// is the scopes they tick: a narrower grant than requested.
	var consented []string
	if r.URL.Query().Has("consent_scope") {
		consented = strings.Fields(r.URL.Query().Get("consent_scope"))
	}
	for _, s := range ar.GetRequestedScopes() {
		if consented == nil || slices.Contains(consented, s) {
			ar.GrantScope(s)
		}
	}
	for _, a := range ar.GetRequestedAudience() {
		ar.GrantAudience(a)
	}
	subject := Subject
	if h := r.URL.Query().Get("login_hint"); h != "" && len(h) <= 64 {
		subject = h
	}
	resp, err := p.oauth.NewAuthorizeResponse(ctx, ar, &fosite.DefaultSession{Subject: subject, Username: subject})
	if err != nil {
		p.oauth.WriteAuthorizeError(ctx, w, ar, err)
		return
	}
	p.oauth.WriteAuthorizeResponse(ctx, w, ar, resp)
}

func (p *Provider) handleToken(w http.ResponseWriter, r *http.Request) {
	if p.limited(w) {
		return
	}
	// Parsing the form here is harmless: fosite's ParseMultipartForm reuses
	// r.PostForm once it is set.
	if r.PostFormValue("grant_type") == "refresh_token" {
		p.handleRefresh(w, r)
		return
	}
	ctx := r.Context()
	ar, err := p.validate(ctx, r)
	jkt := ""
	if err == nil && r.Header.Get("DPoP") != "" && ar.GetGrantTypes().ExactOne("authorization_code") {
		if jkt = p.dpop.verify(r, ""); jkt == "" {
			p.stats.dpopRefused.Add(1)
			err = errDPoPProof // before the code is spent
		}
	}
	var resp fosite.AccessResponder
	if err == nil {
		resp, err = p.commit(ctx, ar)
	}
	if err != nil {
		p.oauth.WriteAccessError(ctx, w, ar, err)
		return
	}
	if jkt != "" {
		p.dpop.bindTo(ar.GetID(), jkt)
		p.stats.dpopBound.Add(1)
		resp.SetTokenType("DPoP")
	}
	if ar.GetGrantTypes().ExactOne("authorization_code") {
		p.stats.codeExchanges.Add(1)
		if p.absolute > 0 {
			p.graceMu.Lock()
			p.consented[ar.GetID()] = time.Now()
			p.graceMu.Unlock()
		}
	}
	p.oauth.WriteAccessResponse(ctx, w, ar, resp)
}

func (p *Provider) handleRefresh(w http.ResponseWriter, r *http.Request) {
	lost := false
	if fp := p.refreshFault.Load(); fp != nil {
		switch f := (*fp)(); f {
		case FaultNone:
		case FaultLostAnswer:
			lost = true
		default:
			p.writeFault(w, r, f)
			return
		}
	}

	ctx := r.Context()
	if err := r.ParseForm(); err != nil {
		p.oauth.WriteAccessError(ctx, w, nil, fosite.ErrInvalidRequest.WithWrap(err))
		return
	}
	sig := p.strategy.RefreshTokenSignature(ctx, r.PostForm.Get("refresh_token"))
	defer p.lockGrant(ctx, sig)()

	// A bound grant's refresh without a proof of its key is refused
	// before fosite looks at the refresh token: nothing is spent or
	// revoked, whoever holds the token.
	bound := p.dpop.boundTo(p.grantOf(ctx, sig))
	if bound != "" && p.dpop.verify(r, "") != bound {
		p.stats.refreshRejected.Add(1)
		p.stats.dpopRefused.Add(1)
		p.oauth.WriteAccessError(ctx, w, nil, errDPoPProof)
		return
	}

	// Decide reuse before fosite runs: on reuse fosite deletes the presented
	// token's session, so afterwards it could no longer tell reuse from a
	// token it never issued.
	reused := sig != "" && p.store.wasRotated(sig)
	if reused && p.replay(w, sig) {
		return
	}

	ar, err := p.validate(ctx, r)
	if err == nil && reused {
		// Safety net that must never fire: fosite itself rejects rotated
		// refresh tokens. Nothing has been stored at this point.
		err = fosite.ErrInvalidGrant.WithHint("The refresh token was already used.")
	}
	if err == nil && p.pastAbsolute(ar.GetID()) {
		err = fosite.ErrInvalidGrant.WithHint("The grant has reached its absolute lifetime.")
	}
	if d := time.Duration(p.refreshLatency.Load()); d > 0 {
		// Between validation (token read as active) and rotation: the
		// window in which an unserialised provider would let a concurrent
		// request redeem the same token. Deliberately not cut short by the
		// request context, see Options.RefreshLatency.
		time.Sleep(d)
	}
	if err == nil {
		p.narrowScopes(ar)
	}
	var resp fosite.AccessResponder
	if err == nil {
		resp, err = p.commit(ctx, ar)
	}
	if err == nil && p.omitRefreshScope {
		delete(resp.ToMap(), "scope") // ToMap is the answer's own map
	}
	if err != nil {
		p.stats.refreshRejected.Add(1)
		if reused {
			p.stats.refreshReuse.Add(1)
			if bound != "" {
				p.stats.dpopReuse.Add(1)
			}
		}
		if p.deadGrant != nil && fosite.ErrorToRFC6749Error(err).ErrorField == fosite.ErrInvalidGrant.ErrorField {
			p.writeDeadGrant(w)
			return
		}
		p.oauth.WriteAccessError(ctx, w, ar, err)
		return
	}
	p.stats.refreshes.Add(1)
	if bound != "" {
		p.stats.dpopRefreshes.Add(1)
		resp.SetTokenType("DPoP")
	}
	p.timeline.refreshed(time.Now(), r.UserAgent(), ar.GetID())
	if p.grace <= 0 && !lost {
		p.oauth.WriteAccessResponse(ctx, w, ar, resp)
		return
	}
	rec := httptest.NewRecorder()
	p.oauth.WriteAccessResponse(ctx, rec, ar, resp)
	if p.grace > 0 {
		p.remember(sig, rec.Body.Bytes())
	}
	if lost {
		// Processed, never answered: the connection closes without a
		// response.
		p.stats.refreshFaults.Add(1)
		p.stats.lostAnswers.Add(1)
		panic(http.ErrAbortHandler)
	}
	maps.Copy(w.Header(), rec.Header())
	w.WriteHeader(rec.Code)
	_, _ = w.Write(rec.Body.Bytes())
}

// narrowScopes keeps, of the scopes a refresh grants, those of
// Options.RefreshScopes (when set): the rotated tokens and the answer
// carry only those.
func (p *Provider) narrowScopes(ar fosite.AccessRequester) {
	req, ok := ar.(*fosite.AccessRequest)
	if p.refreshScopes == nil || !ok {
		return
	}
	kept := fosite.Arguments{}
	for _, s := range req.GrantedScope {
		if slices.Contains(p.refreshScopes, s) {
			kept = append(kept, s)
		}
	}
	req.GrantedScope = kept
}

// graceAnswer is the answer a refresh token got, kept for ReuseGrace.
type graceAnswer struct {
	at   time.Time
	body []byte
}

// remember keeps the answer the refresh token sig got, and forgets those
// older than the grace window.
func (p *Provider) remember(sig string, body []byte) {
	now := time.Now()
	p.graceMu.Lock()
	defer p.graceMu.Unlock()
	for k, a := range p.answered {
		if now.Sub(a.at) > p.grace {
			delete(p.answered, k)
		}
	}
	p.answered[sig] = graceAnswer{at: now, body: body}
}

// replay answers a rotated refresh token presented again within the grace
// window with the answer it got the first time; false when there is no
// window or it is over.
func (p *Provider) replay(w http.ResponseWriter, sig string) bool {
	if p.grace <= 0 {
		return false
	}
	p.graceMu.Lock()
	a, ok := p.answered[sig]
	p.graceMu.Unlock()
	if !ok || time.Since(a.at) > p.grace {
		return false
	}
	p.stats.graceReplays.Add(1)
	w.Header().Set("Content-Type", "application/json;charset=UTF-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(a.body)
	return true
}

// pastAbsolute reports whether the grant id was consented longer than
// RefreshAbsolute ago.
func (p *Provider) pastAbsolute(id string) bool {
	if p.absolute <= 0 {
		return false
	}
	p.graceMu.Lock()
	at, ok := p.consented[id]
	p.graceMu.Unlock()
	return ok && time.Since(at) > p.absolute
}

// writeDeadGrant answers a dead grant in Options.DeadGrant's words.
func (p *Provider) writeDeadGrant(w http.ResponseWriter) {
	d := p.deadGrant
	body := map[string]any{cmp.Or(d.Field, "error"): d.Code}
	if d.OKFalse {
		body["ok"] = false
	}
	if d.Description != "" {
		body["error_description"] = d.Description
	}
	writeJSON(w, cmp.Or(d.Status, http.StatusBadRequest), body)
}

// handleRevoke revokes the grant of the token presented (RFC 7009). It
// holds the grant's rotation lock, so a refresh in flight cannot re-issue
// tokens for a grant right after it was revoked, nor a revocation hit a
// refresh token in the middle of its rotation.
func (p *Provider) handleRevoke(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	if err := r.ParseForm(); err != nil {
		p.oauth.WriteRevocationResponse(ctx, w, fosite.ErrInvalidRequest.WithWrap(err))
		return
	}
	defer p.lockGrant(ctx, p.strategy.RefreshTokenSignature(ctx, r.PostForm.Get("token")))()
	err := p.oauth.NewRevocationRequest(ctx, r)
	if err == nil {
		p.stats.revocations.Add(1)
	}
	p.oauth.WriteRevocationResponse(ctx, w, err)
}

// validate is the first half of a token request: fosite authenticates the
// client and checks the grant (code or refresh token) without storing
// anything. It then re-stamps token expiry: fosite rounds it to whole seconds
// (so a 300ms lifespan could expire at once or live 1.3s).
func (p *Provider) validate(ctx context.Context, r *http.Request) (fosite.AccessRequester, error) {
	ar, err := p.oauth.NewAccessRequest(ctx, r, new(fosite.DefaultSession))
	if err != nil {
		return ar, err
	}
	now := time.Now().UTC()
	sess := ar.GetSession()
	sess.SetExpiresAt(fosite.AccessToken, now.Add(p.atLifespan))
	if p.rtLifespan > 0 {
		sess.SetExpiresAt(fosite.RefreshToken, now.Add(p.rtLifespan))
	}
	return ar, nil
}

// commit is the second half: fosite consumes the code or rotates the refresh
// token (revoking the grant's previous access token) and stores the new
// tokens.
func (p *Provider) commit(ctx context.Context, ar fosite.AccessRequester) (fosite.AccessResponder, error) {
	resp, err := p.oauth.NewAccessResponse(ctx, ar)
	if err != nil {
		return nil, err
	}
	for k, v := range p.extra {
		resp.SetExtra(k, v)
	}
	if p.omitExpiry {
		delete(resp.ToMap(), "expires_in") // ToMap is the answer's own map
	} else {
		resp.SetExtra("expires_in", expiresIn(ar.GetSession().GetExpiresAt(fosite.AccessToken)))
	}
	return resp, nil
}

// expiresIn is the remaining lifetime in whole seconds, rounded, and at least
// 1: fosite truncates (1.999s -> 1) and a 0 reads as "no expiry" to clients.
func expiresIn(exp time.Time) int64 {
	return max(int64(math.Round(time.Until(exp).Seconds())), 1)
}

func (p *Provider) writeFault(w http.ResponseWriter, r *http.Request, f Fault) {
	// Count before answering, so a client that sees the answer (or its own
	// timeout) also sees the counters.
	p.stats.refreshFaults.Add(1)
	p.stats.refreshRejected.Add(1)
	tempUnavailable := oauthError{Error: "temporarily_unavailable"}
	switch f {
	case FaultUnavailable:
		writeJSON(w, http.StatusServiceUnavailable, tempUnavailable)
	case FaultTooManyRequests:
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusTooManyRequests, tempUnavailable)
	case FaultHang:
		t := time.NewTimer(maxHang)
		defer t.Stop()
		select {
		case <-r.Context().Done():
			// The client is gone; nothing to write.
		case <-t.C:
			writeJSON(w, http.StatusServiceUnavailable, tempUnavailable)
		}
	case FaultInvalidGrant:
		if p.deadGrant != nil {
			p.writeDeadGrant(w)
			return
		}
		writeJSON(w, http.StatusBadRequest, oauthError{Error: "invalid_grant"})
	case FaultInvalidClient:
		// RFC 6749 §5.2: 401 and a challenge for the scheme the client used.
		w.Header().Set("WWW-Authenticate", `Basic realm="sandbox"`)
		writeJSON(w, http.StatusUnauthorized, oauthError{Error: "invalid_client"})
	case FaultUnknownCode:
		writeJSON(w, http.StatusBadRequest, oauthError{Error: UnknownCode})
	case FaultNotJSON:
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte("<html><body>Bad Request</body></html>"))
	default:
		writeJSON(w, http.StatusInternalServerError, oauthError{Error: "server_error"})
	}
}

func (p *Provider) handleResource(w http.ResponseWriter, r *http.Request) {
	token, inDPoP, ok := accessToken(r)
	if ok {
		use, ar, err := p.oauth.IntrospectToken(r.Context(), token, fosite.AccessToken, new(fosite.DefaultSession))
		bound := ""
		if err == nil {
			bound = p.dpop.boundTo(ar.GetID())
		}
		// A bound token only in the DPoP scheme with a proof of its key;
		// a bearer token only as one.
		if err == nil && bound != "" && (!inDPoP || p.dpop.verify(r, token) != bound) {
			p.stats.dpopRefused.Add(1)
			err = errDPoPProof
		}
		if err == nil && use == fosite.AccessToken && inDPoP == (bound != "") {
			p.stats.resourceAccepted(r.UserAgent())
			p.timeline.resource(time.Now(), r.UserAgent(), true)
			writeJSON(w, http.StatusOK, resourceBody{
				OK:      true,
				Subject: ar.GetSession().GetSubject(),
				Scope:   strings.Join(ar.GetGrantedScopes(), " "),
			})
			return
		}
	}
	p.stats.resource401.Add(1)
	p.timeline.resource(time.Now(), r.UserAgent(), false)
	if inDPoP {
		w.Header().Set("WWW-Authenticate", `DPoP error="invalid_token"`)
		writeJSON(w, http.StatusUnauthorized, oauthError{Error: "invalid_token"})
		return
	}
	w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
	writeJSON(w, http.StatusUnauthorized, oauthError{Error: "invalid_token"})
}

func (p *Provider) handleUserInfo(w http.ResponseWriter, r *http.Request) {
	if token, ok := bearerToken(r); ok {
		use, ar, err := p.oauth.IntrospectToken(r.Context(), token, fosite.AccessToken, new(fosite.DefaultSession))
		if err == nil && use == fosite.AccessToken {
			writeJSON(w, http.StatusOK, map[string]string{"sub": ar.GetSession().GetSubject()})
			return
		}
	}
	w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
	writeJSON(w, http.StatusUnauthorized, oauthError{Error: "invalid_token"})
}

func bearerToken(r *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	token = strings.TrimSpace(token)
	return token, ok && strings.EqualFold(scheme, "Bearer") && token != ""
}

func (p *Provider) handleStats(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, p.Stats())
}

type oauthError struct {
	Error string `json:"error"`
}

type resourceBody struct {
	OK      bool   `json:"ok"`
	Subject string `json:"subject"`
	Scope   string `json:"scope"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
