package httpapi

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/tokenguard/tokenguard"
	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/httpapi/console"
)

const ( // page sizes of GET /connections
	defaultConnectionsLimit = 100
	maxConnectionsLimit     = 1000
)

// connectionView is one connection in GET /connections: no token, ever.
type connectionView struct {
	Connection    string          `json:"connection"`
	Provider      string          `json:"provider"` // "" for the environment's
	Status        domain.Status   `json:"status"`
	Reason        string          `json:"reason,omitempty"`
	Expiry        *time.Time      `json:"expiry"` // null: the provider gave none
	RefreshExpiry *time.Time      `json:"refresh_expiry,omitempty"`
	LastRefresh   time.Time       `json:"last_refresh"`
	Version       int64           `json:"version"`
	Account       string          `json:"account,omitempty"`
	Scopes        string          `json:"scopes,omitempty"`
	MissingScopes string          `json:"missing_scopes,omitempty"`
	Metadata      json.RawMessage `json:"metadata"` // {} when none
	Tags          []string        `json:"tags"`
	Failure       *failureView    `json:"failure,omitempty"`        // while the refreshes fail
	Binding       string          `json:"binding"`                  // "dpop" or "bearer"
	DPoPJKT       string          `json:"dpop_jkt,omitempty"`       // the key's thumbprint
	ScopesReduced string          `json:"scopes_reduced,omitempty"` // no longer granted by a refresh (still usable)
}

// failureView is a refresh failure episode: the last answer, how many in
// a row since when, and the next attempt (null: none until a new grant).
type failureView struct {
	Failing     bool       `json:"failing"`
	HTTPStatus  int        `json:"http_status,omitempty"`
	Code        string     `json:"code,omitempty"`
	Failures    int        `json:"failures"`
	Since       time.Time  `json:"since"`
	NextAttempt *time.Time `json:"next_attempt"`
}

// nonNil is ss, or [] (not JSON null) for nil.
func nonNil(ss []string) []string {
	if ss == nil {
		return []string{}
	}
	return ss
}

// listConnections answers GET /connections?after=NAME&limit=N: a keyset
// page in name order, and next, the after of the following page.
func (s *Server) listConnections(w http.ResponseWriter, r *http.Request) {
	if s.deps.Connections == nil {
		writeJSON(w, http.StatusServiceUnavailable, errorBody{Error: "this server does not list connections", Code: "not_configured"})
		return
	}
	q := r.URL.Query()
	limit, err := strconv.Atoi(cmp.Or(q.Get("limit"), strconv.Itoa(defaultConnectionsLimit)))
	if err != nil || limit < 1 || limit > maxConnectionsLimit {
		writeJSON(w, http.StatusBadRequest, errorBody{Error: "limit must be 1 to " + strconv.Itoa(maxConnectionsLimit), Code: "bad_request"})
		return
	}
	after := q.Get("after")
	if err := domain.ValidateName(after); after != "" && err != nil {
		writeError(w, "", err)
		return
	}
	page, next, err := console.Visible(r.Context(), s.deps.Connections, keyAccess(r.Context()), domain.ConnectionFilter{}, after, limit)
	if err != nil {
		s.failed(w, r, "", err)
		return
	}
	body := struct {
		Connections []connectionView `json:"connections"`
		Next        *string          `json:"next"` // null on the last page
	}{Connections: make([]connectionView, 0, len(page))}
	if next != "" {
		body.Next = &next
	}
	for _, c := range page {
		v := connectionView{
			Connection: c.Name, Provider: c.Provider, Status: c.Status, Reason: c.StatusReason,
			LastRefresh: c.ObtainedAt.UTC(), Version: c.Version,
			Account: c.Binding.Account, Scopes: c.Binding.Scopes, MissingScopes: c.Binding.MissingScopes,
			Metadata: c.Metadata.Object, Tags: nonNil(c.Metadata.Tags),
			Expiry: utcOrNil(c.Expiry), RefreshExpiry: utcOrNil(c.RefreshExpiry),
			Binding: "bearer", DPoPJKT: c.DPoPJKT, ScopesReduced: c.Binding.ScopesReduced,
		}
		if c.DPoPJKT != "" {
			v.Binding = "dpop"
		}
		if len(v.Metadata) == 0 {
			v.Metadata = json.RawMessage("{}")
		}
		if f := c.Failure; f.Failures > 0 {
			v.Failure = &failureView{Failing: f.Failing, HTTPStatus: f.HTTPStatus, Code: f.Code,
				Failures: f.Failures, Since: f.Since.UTC()}
			if !f.Blocked(f.LastAt) {
				v.Failure.NextAttempt = utcOrNil(f.RetryAt)
			}
		}
		body.Connections = append(body.Connections, v)
	}
	writeJSON(w, http.StatusOK, body)
}

// tokenView is the token API's answer: never the refresh token.
type tokenView struct {
	AccessToken string     `json:"access_token"`
	TokenType   string     `json:"token_type"`
	Expiry      *time.Time `json:"expiry"` // null: the provider gave none
	Connection  string     `json:"connection"`
	Provider    string     `json:"provider"` // "" for the environment's
	Version     int64      `json:"version"`
}

// writeToken answers c's token (Pragma: HTTP/1.0 caches too), or err. A
// DPoP-bound token is refused: it is useless without a proof.
func (s *Server) writeToken(w http.ResponseWriter, r *http.Request, name string, c tokenguard.Credential, err error) {
	if err == nil && c.DPoPJKT != "" {
		err = fmt.Errorf("connection %s: %w", c.Connection, domain.ErrSenderConstrained)
	}
	if err != nil {
		s.failed(w, r, name, err)
		return
	}
	w.Header().Set("Pragma", "no-cache")
	writeJSON(w, http.StatusOK, tokenView{AccessToken: c.Token.AccessToken, TokenType: c.Token.Type(),
		Expiry: utcOrNil(c.Token.Expiry), Connection: c.Connection, Provider: c.Provider, Version: c.Version})
}

// utcOrNil is t in UTC, nil (JSON null) for the zero time.
func utcOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}

// token answers GET /connections/{name}/token (name checked by requireScope).
func (s *Server) token(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	c, err := s.deps.Tokens.Credential(r.Context(), name)
	s.writeToken(w, r, name, c, err)
}

// decodeBody decodes r's JSON body into v, refusing unknown fields and,
// when whole, anything after the value.
func decodeBody(r *http.Request, v any, whole bool) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil && whole && dec.Decode(&struct{}{}) != io.EOF {
		err = errors.New("trailing data")
	}
	return err
}

// refreshToken answers POST /connections/{name}/token/refresh {"stale_version": N}
// after the API refused version N: a refresh only if still N, then the current token.
func (s *Server) refreshToken(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	var body struct {
		StaleVersion *int64 `json:"stale_version"`
	}
	if err := decodeBody(r, &body, true); err != nil || body.StaleVersion == nil || *body.StaleVersion < 1 {
		writeJSON(w, http.StatusBadRequest, errorBody{
			Error: `the body must be {"stale_version": N}, N the version of the token the API refused`, Code: "bad_request", Connection: name})
		return
	}
	// A version newer than this process knows, taken as stale, would keep
	// the connection out of the cache until the version catches up.
	cur, err := s.deps.Tokens.Credential(r.Context(), name)
	if err == nil && *body.StaleVersion > cur.Version {
		writeJSON(w, http.StatusConflict, errorBody{
			Error: fmt.Sprintf("stale_version %d is newer than the connection's version %d; GET the token again", *body.StaleVersion, cur.Version),
			Code:  "unknown_version", Connection: name})
		return
	}
	if err != nil {
		s.failed(w, r, name, err)
		return
	}
	c, err := s.deps.Tokens.ForceRefresh(r.Context(), name, *body.StaleVersion)
	s.writeToken(w, r, name, c, err)
}

// proofView is POST /connections/{name}/dpop-proof's answer.
type proofView struct {
	AccessToken string     `json:"access_token"`
	TokenType   string     `json:"token_type"`
	DPoP        string     `json:"dpop"`
	ExpiresAt   *time.Time `json:"expires_at"`
}

// methodPattern is an HTTP method token, as a proof's htm.
var methodPattern = regexp.MustCompile(`^[A-Za-z]{1,16}$`)

// dpopProof answers POST /connections/{name}/dpop-proof {"method","url","nonce"}: the
// token and a proof for that one request (RFC 9449 §7) under the connection's API.
func (s *Server) dpopProof(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	var body struct {
		Method string `json:"method"`
		URL    string `json:"url"`
		Nonce  string `json:"nonce"`
	}
	if err := decodeBody(r, &body, true); err != nil || !methodPattern.MatchString(body.Method) || body.URL == "" {
		writeJSON(w, http.StatusBadRequest, errorBody{
			Error: `the body must be {"method": "GET", "url": "https://api.example.com/..."}`, Code: "bad_request", Connection: name})
		return
	}
	c, err := s.deps.Tokens.Credential(r.Context(), name)
	if err != nil {
		s.failed(w, r, name, err)
		return
	}
	if c.DPoPJKT == "" {
		writeJSON(w, http.StatusConflict, errorBody{
			Error: "the connection's grant is a bearer grant: GET /connections/{name}/token", Code: "not_sender_constrained", Connection: name})
		return
	}
	// The URL must be under the API the token and its proof are for.
	base, err := s.target(c.Provider, "/", "")
	u, uerr := url.Parse(body.URL)
	switch {
	case err != nil:
	case uerr != nil || u.User != nil || u.Fragment != "":
		err = errors.New("url: not an absolute http(s) URL without credentials or fragment")
	case !under(u, base) || strings.Contains("/"+u.Path+"/", "/../"):
		err = fmt.Errorf("url: not under the connection's API base URL %s://%s%s/", base.Scheme, base.Host, strings.TrimSuffix(base.Path, "/"))
	}
	if err != nil {
		writeJSON(w, http.StatusBadRequest, errorBody{Error: err.Error(), Code: "url_not_allowed", Connection: name})
		return
	}
	proof, err := s.deps.Tokens.DPoPProof(r.Context(), c, strings.ToUpper(body.Method), body.URL, body.Nonce)
	if err != nil {
		s.failed(w, r, name, err)
		return
	}
	w.Header().Set("Pragma", "no-cache")
	writeJSON(w, http.StatusOK, proofView{AccessToken: c.Token.AccessToken, TokenType: "DPoP", DPoP: proof, ExpiresAt: utcOrNil(c.Token.Expiry)})
}
