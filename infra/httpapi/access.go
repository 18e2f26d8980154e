package httpapi

import (
	"encoding/json"
	"errors"
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
// refuses every key. domain.KeyAccess.Permit decides.
func requireScope(rt route, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		if !permit(w, keyAccess(r.Context()), rt.scope, name, "") {
			return
		}
		if name != "" {
			if err := domain.ValidateName(name); err != nil {
				writeError(w, "", err)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// permit answers 403 and false unless acc may use scope s on connection
// name ("": none named); what says what needed s, when it was not the route.
func permit(w http.ResponseWriter, acc domain.KeyAccess, s domain.Scope, name, what string) bool {
	err := acc.Permit(s, name)
	switch {
	case err == nil:
		return true
	case s == "" || !slices.Contains(domain.AllScopes, s):
		writeForbidden(w, forbiddenBody{Error: "this route declares no scope; no key may call it", Code: "missing_scope"})
	case errors.Is(err, domain.ErrMissingScope) && what != "":
		writeForbidden(w, forbiddenBody{Error: what + " needs the scope " + string(s) + " (tokenctl apikey create --scopes)",
			Code: "missing_scope", MissingScope: s})
	case errors.Is(err, domain.ErrMissingScope):
		writeForbidden(w, forbiddenBody{Error: "the API key lacks the scope " + string(s) + " (tokenctl apikey create --scopes)",
			Code: "missing_scope", MissingScope: s})
	default:
		writeForbidden(w, forbiddenBody{Error: "the API key's connection patterns do not match " + name + " (tokenctl apikey create --connections)",
			Code: "connection_not_allowed", Connection: name, Allowed: acc.Connections})
	}
	return false
}
