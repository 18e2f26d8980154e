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

// writeToken answers c's token (Pragma: HTTP/1.0 caches too), or err.
func (s *Server) writeToken(w http.ResponseWriter, r *http.Request, name string, c tokenguard.Credential, err error) {
	if err == nil {
		err = senderConstrained(c)
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

// refreshToken answers POST /connections/{name}/token/refresh
// {"stale_version": N} after the API refused version N: a refresh only if
// the stored version is still N, then the current token.
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
