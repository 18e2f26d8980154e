package httpapi

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/provider"
)

const flowCookie = "tokenguard_oauth"

// flow is what the browser carries from /oauth/connect to /oauth/callback.
// state is checked against the provider's redirect; the PKCE verifier
// proves the code is redeemed by whoever started the flow.
type flow struct {
	State      string `json:"s"`
	Verifier   string `json:"v"`
	Connection string `json:"c"`
}

func (s *Server) oauthConfigured() bool {
	c := s.deps.OAuth
	return c != nil && c.Endpoint.AuthURL != "" && c.RedirectURL != "" && c.Endpoint.TokenURL != ""
}

// connect starts the authorization-code flow for ?connection=NAME.
func (s *Server) connect(w http.ResponseWriter, r *http.Request) {
	if !s.oauthConfigured() {
		writeJSON(w, http.StatusServiceUnavailable, errorBody{
			Error: "the connect flow needs OAUTH_AUTH_URL, OAUTH_TOKEN_URL and OAUTH_REDIRECT_URL", Code: "not_configured"})
		return
	}
	name := r.URL.Query().Get("connection")
	if err := domain.ValidateConnectionID(name); err != nil {
		writeError(w, "", err)
		return
	}
	f := flow{State: rand.Text(), Verifier: oauth2.GenerateVerifier(), Connection: name}
	raw, _ := json.Marshal(f)
	http.SetCookie(w, &http.Cookie{
		Name:     flowCookie,
		Value:    base64.RawURLEncoding.EncodeToString(raw),
		Path:     "/oauth/",
		MaxAge:   int((10 * time.Minute).Seconds()),
		HttpOnly: true,
		Secure:   r.TLS != nil,
		SameSite: http.SameSiteLaxMode, // sent on the provider's top-level redirect back
	})
	http.Redirect(w, r, s.deps.OAuth.AuthCodeURL(f.State, oauth2.S256ChallengeOption(f.Verifier)), http.StatusFound)
}

// callback checks state, redeems the code and stores the first token.
func (s *Server) callback(w http.ResponseWriter, r *http.Request) {
	if !s.oauthConfigured() {
		writeJSON(w, http.StatusServiceUnavailable, errorBody{Error: "the connect flow is not configured", Code: "not_configured"})
		return
	}
	// Whatever happens, the flow is single-use.
	http.SetCookie(w, &http.Cookie{Name: flowCookie, Path: "/oauth/", MaxAge: -1, HttpOnly: true, Secure: r.TLS != nil})
	q := r.URL.Query()
	f, ok := readFlow(r)
	if !ok {
		writeJSON(w, http.StatusBadRequest, errorBody{Error: "no authorization in progress (missing or expired cookie); start at /oauth/connect", Code: "bad_state"})
		return
	}
	if subtle.ConstantTimeCompare([]byte(q.Get("state")), []byte(f.State)) != 1 {
		s.deps.Log.Warn("oauth callback with a wrong state", "connection", f.Connection)
		writeJSON(w, http.StatusBadRequest, errorBody{Error: "state does not match; start again at /oauth/connect", Code: "bad_state", Connection: f.Connection})
		return
	}
	if e := q.Get("error"); e != "" {
		writeJSON(w, http.StatusBadRequest, errorBody{Error: "the provider refused the authorization: " + oauthCode(e), Code: "authorization_failed", Connection: f.Connection})
		return
	}
	code := q.Get("code")
	if code == "" {
		writeJSON(w, http.StatusBadRequest, errorBody{Error: "no authorization code", Code: "bad_request", Connection: f.Connection})
		return
	}
	exCtx := contextWithClient(r, s.deps.OAuthHTTP)
	tok, err := s.deps.OAuth.Exchange(exCtx, code, oauth2.VerifierOption(f.Verifier))
	if err != nil {
		// Never log err itself: a RetrieveError prints the response body.
		var re *oauth2.RetrieveError
		reason := "no answer"
		if errors.As(err, &re) {
			reason = oauthCode(re.ErrorCode)
		}
		s.deps.Log.Warn("code exchange failed", "connection", f.Connection, "reason", reason)
		writeJSON(w, http.StatusBadGateway, errorBody{Error: "code exchange failed: " + reason, Code: "exchange_failed", Connection: f.Connection})
		return
	}
	t, err := s.deps.Connector.Connect(r.Context(), f.Connection, provider.GrantFrom(tok))
	if errors.Is(err, domain.ErrInvalidToken) {
		writeJSON(w, http.StatusBadGateway, errorBody{Error: "the provider granted no usable token: " + err.Error(), Code: "exchange_failed", Connection: f.Connection})
		return
	}
	if err != nil {
		s.logFailure(r, f.Connection, err)
		writeError(w, f.Connection, err)
		return
	}
	s.deps.Log.Info("connection connected", "token", t)
	writeJSON(w, http.StatusOK, map[string]any{
		"connection": t.ConnectionID, "status": t.Status, "expiry": t.Expiry, "version": t.Version,
	})
}

func readFlow(r *http.Request) (flow, bool) {
	c, err := r.Cookie(flowCookie)
	if err != nil {
		return flow{}, false
	}
	raw, err := base64.RawURLEncoding.DecodeString(c.Value)
	if err != nil {
		return flow{}, false
	}
	var f flow
	if json.Unmarshal(raw, &f) != nil || f.State == "" || f.Verifier == "" || domain.ValidateConnectionID(f.Connection) != nil {
		return flow{}, false
	}
	return f, true
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

func contextWithClient(r *http.Request, c *http.Client) context.Context {
	return context.WithValue(r.Context(), oauth2.HTTPClient, c)
}
