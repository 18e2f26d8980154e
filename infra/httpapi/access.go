package httpapi

import (
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
	Allowed      []string     `json:"allowed_connections,omitempty"` // the key's patterns
}

func (b forbiddenBody) code() string { return b.Code }

// requireScope answers 403 unless domain.KeyAccess.Permit lets the key use
// the route's scope on the connection it names (then 400 for a bad name).
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
// name ("": none named); what names what needed s, when not the route.
func permit(w http.ResponseWriter, acc domain.KeyAccess, s domain.Scope, name, what string) bool {
	err := acc.Permit(s, name)
	if err == nil {
		return true
	}
	b := forbiddenBody{Code: "missing_scope", MissingScope: s}
	switch {
	case s == "" || !slices.Contains(domain.AllScopes, s):
		b = forbiddenBody{Error: "this route declares no scope; no key may call it", Code: "missing_scope"}
	case errors.Is(err, domain.ErrMissingScope) && what != "":
		b.Error = what + " needs the scope " + string(s) + " (tokenctl apikey create --scopes)"
	case errors.Is(err, domain.ErrMissingScope):
		b.Error = "the API key lacks the scope " + string(s) + " (tokenctl apikey create --scopes)"
	default:
		b = forbiddenBody{Error: "the API key's connection patterns do not match " + name + " (tokenctl apikey create --connections)",
			Code: "connection_not_allowed", Connection: name, Allowed: acc.Connections}
	}
	writeJSON(w, http.StatusForbidden, b)
	return false
}
