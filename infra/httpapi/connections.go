package httpapi

import (
	"net/http"
	"strconv"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/httpapi/console"
)

const ( // page sizes of GET /connections
	defaultConnectionsLimit = 100
	maxConnectionsLimit     = 1000
)

// connectionView is one connection in GET /connections: no token, ever.
type connectionView struct {
	Connection    string        `json:"connection"`
	Provider      string        `json:"provider"` // "" for the environment's
	Status        domain.Status `json:"status"`
	Reason        string        `json:"reason,omitempty"`
	Expiry        *time.Time    `json:"expiry"` // null: the provider gave none
	RefreshExpiry *time.Time    `json:"refresh_expiry,omitempty"`
	LastRefresh   time.Time     `json:"last_refresh"`
	Version       int64         `json:"version"`
	Account       string        `json:"account,omitempty"`
	Scopes        string        `json:"scopes,omitempty"`
	MissingScopes string        `json:"missing_scopes,omitempty"`
	Metadata      jsonObject    `json:"metadata"`
	Tags          []string      `json:"tags"`
	Failure       *failureView  `json:"failure,omitempty"`  // while the refreshes fail
	Binding       string        `json:"binding"`            // "dpop" or "bearer"
	DPoPJKT       string        `json:"dpop_jkt,omitempty"` // the key's thumbprint
	// ScopesReduced: scopes a refresh no longer granted (still usable).
	ScopesReduced string `json:"scopes_reduced,omitempty"`
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

type jsonObject []byte

func (o jsonObject) MarshalJSON() ([]byte, error) {
	if len(o) == 0 {
		return []byte("{}"), nil
	}
	return o, nil
}

// nonNil is ss, or [] (not JSON null) for nil.
func nonNil(ss []string) []string {
	if ss == nil {
		return []string{}
	}
	return ss
}

func viewOf(c domain.Connection) connectionView {
	v := connectionView{
		Connection: c.Name, Provider: c.Provider, Status: c.Status, Reason: c.StatusReason,
		LastRefresh: c.ObtainedAt.UTC(), Version: c.Version,
		Account: c.Binding.Account, Scopes: c.Binding.Scopes, MissingScopes: c.Binding.MissingScopes,
		Metadata: jsonObject(c.Metadata.Object), Tags: nonNil(c.Metadata.Tags),
		Expiry: utcOrNil(c.Expiry), RefreshExpiry: utcOrNil(c.RefreshExpiry),
		Binding: "bearer", DPoPJKT: c.DPoPJKT, ScopesReduced: c.Binding.ScopesReduced,
	}
	if c.DPoPJKT != "" {
		v.Binding = "dpop"
	}
	if f := c.Failure; f.Failures > 0 {
		v.Failure = &failureView{Failing: f.Failing, HTTPStatus: f.HTTPStatus, Code: f.Code, Failures: f.Failures, Since: f.Since.UTC()}
		if !f.Blocked(f.LastAt) {
			v.Failure.NextAttempt = utcOrNil(f.RetryAt)
		}
	}
	return v
}

// listConnections answers GET /connections?after=NAME&limit=N: a keyset
// page in name order, and next, the after of the following page.
func (s *Server) listConnections(w http.ResponseWriter, r *http.Request) {
	if s.deps.Connections == nil {
		writeJSON(w, http.StatusServiceUnavailable, errorBody{Error: "this server does not list connections", Code: "not_configured"})
		return
	}
	q := r.URL.Query()
	limit := defaultConnectionsLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxConnectionsLimit {
			writeJSON(w, http.StatusBadRequest, errorBody{Error: "limit must be 1 to " + strconv.Itoa(maxConnectionsLimit), Code: "bad_request"})
			return
		}
		limit = n
	}
	after := q.Get("after")
	if after != "" {
		if err := domain.ValidateName(after); err != nil {
			writeError(w, "", err)
			return
		}
	}
	// One more row than asked says whether a next page exists.
	acc := keyAccess(r.Context())
	page, err := console.Visible(r.Context(), s.deps.Connections, acc, domain.ConnectionFilter{}, after, limit+1)
	if err != nil {
		s.failed(w, r, "", err)
		return
	}
	body := struct {
		Connections []connectionView `json:"connections"`
		Next        *string          `json:"next"` // null on the last page
	}{Connections: make([]connectionView, 0, min(len(page), limit))}
	if len(page) > limit {
		page = page[:limit]
		next := page[limit-1].Name
		body.Next = &next
	}
	for _, c := range page {
		body.Connections = append(body.Connections, viewOf(c))
	}
	writeJSON(w, http.StatusOK, body)
}
