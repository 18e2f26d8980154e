package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/tokenguard/tokenguard"
)

// tokenView is the token API's answer: never the refresh token.
type tokenView struct {
	AccessToken string     `json:"access_token"`
	TokenType   string     `json:"token_type"`
	Expiry      *time.Time `json:"expiry"` // null: the provider gave none
	Connection  string     `json:"connection"`
	Provider    string     `json:"provider"` // "" for the environment's
	Version     int64      `json:"version"`
}

// writeToken answers a token. writeJSON's no-store keeps it out of every
// cache; Pragma covers HTTP/1.0 ones.
func writeToken(w http.ResponseWriter, c tokenguard.Credential) {
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

// token answers GET /connections/{name}/token: the connection's access
// token, valid until expiry (the provider's expiry minus the skew), from
// the cache when it is fresh.
func (s *Server) token(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name") // validated by requireScope
	c, err := s.deps.Tokens.Credential(r.Context(), name)
	if err == nil {
		err = senderConstrained(c)
	}
	if err != nil {
		s.failed(w, r, name, err)
		return
	}
	writeToken(w, c)
}

// refreshToken answers POST /connections/{name}/token/refresh
// {"stale_version": N}: the caller's API answered 401 to version N. The
// connection is refreshed only if its stored version is still N (one
// refresh per stale version fleet-wide); the answer is the current token.
func (s *Server) refreshToken(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name") // validated by requireScope
	var body struct {
		StaleVersion *int64 `json:"stale_version"`
	}
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	err := dec.Decode(&body)
	if err == nil && dec.Decode(&struct{}{}) != io.EOF {
		err = errors.New("trailing data")
	}
	if err != nil || body.StaleVersion == nil || *body.StaleVersion < 1 {
		writeJSON(w, http.StatusBadRequest, errorBody{
			Error: `the body must be {"stale_version": N}, N the version of the token the API refused`, Code: "bad_request", Connection: name})
		return
	}
	// A version newer than any this process knows was never handed out
	// here; taken as stale it would keep the connection out of the cache
	// until the version catches up. A caller whose token came from another
	// server instance gets the token again and reports that one's version.
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
	if err == nil {
		err = senderConstrained(c)
	}
	if err != nil {
		s.failed(w, r, name, err)
		return
	}
	writeToken(w, c)
}
