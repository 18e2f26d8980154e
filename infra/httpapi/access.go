package httpapi

import (
	"encoding/json"
	"net/http"
	"slices"

	"github.com/tokenguard/tokenguard/domain"
)

// forbiddenBody is a 403: what the key lacks, the scope or the connection
// pattern, so that an operator knows which key to make.
type forbiddenBody struct {
	Error        string       `json:"error"`
	Code         string       `json:"code"` // missing_scope or connection_not_allowed
	MissingScope domain.Scope `json:"missing_scope,omitempty"`
	Connection   string       `json:"connection,omitempty"`
	// Allowed are the key's connection patterns, which do not match
	// Connection.
	Allowed []string `json:"allowed_connections,omitempty"`
}

func writeForbidden(w http.ResponseWriter, b forbiddenBody) {
	w.Header().Set("Tokenguard-Error", b.Code)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusForbidden)
	_ = json.NewEncoder(w).Encode(b)
}

// requireScope answers 403 unless the request's key holds the route's
// scope and, on a route of one connection, a pattern matching its name
// (then 400 unless that is a valid name). A route that names no scope
// refuses every key.
func requireScope(rt route, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		acc := keyAccess(r.Context())
		if rt.scope == "" || !slices.Contains(domain.AllScopes, rt.scope) {
			writeForbidden(w, forbiddenBody{Error: "this route declares no scope; no key may call it", Code: "missing_scope"})
			return
		}
		if !acc.Has(rt.scope) {
			writeForbidden(w, forbiddenBody{Error: "the API key lacks the scope " + string(rt.scope) + " (tokenctl apikey create --scopes)",
				Code: "missing_scope", MissingScope: rt.scope})
			return
		}
		if name := r.PathValue("name"); name != "" {
			if !allowConnection(w, acc, name) {
				return
			}
			if err := domain.ValidateName(name); err != nil {
				writeError(w, "", err)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// allowConnection answers 403 and false unless one of the key's patterns
// matches the connection name.
func allowConnection(w http.ResponseWriter, acc domain.KeyAccess, name string) bool {
	if acc.AllowsConnection(name) {
		return true
	}
	writeForbidden(w, forbiddenBody{Error: "the API key's connection patterns do not match " + name + " (tokenctl apikey create --connections)",
		Code: "connection_not_allowed", Connection: name, Allowed: acc.Connections})
	return false
}

// allowScope answers 403 and false unless the key holds scope s: for a
// right a request asks for in its body.
func allowScope(w http.ResponseWriter, acc domain.KeyAccess, s domain.Scope, what string) bool {
	if acc.Has(s) {
		return true
	}
	writeForbidden(w, forbiddenBody{Error: what + " needs the scope " + string(s) + " (tokenctl apikey create --scopes)",
		Code: "missing_scope", MissingScope: s})
	return false
}
