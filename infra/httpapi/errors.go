package httpapi

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/tokenguard/tokenguard/infra/httpapi/problem"
)

// errorBody is an error answer: a stable code and a message for people.
// Neither ever carries a token.
type errorBody struct {
	Error      string `json:"error"`
	Code       string `json:"code"`
	Connection string `json:"connection,omitempty"`
}

// coded is an error answer whose code goes in Tokenguard-Error, which tells
// tokenguard's own errors from the API's answers the proxy passes on.
type coded interface{ code() string }

func (e errorBody) code() string { return e.Code }

func writeError(w http.ResponseWriter, connection string, err error) {
	p := problem.Of(err)
	if p.RetryAfter > 0 {
		setRetryAfter(w, p.RetryAfter)
	}
	writeJSON(w, p.Status, errorBody{Error: p.Message, Code: p.Code, Connection: connection})
}

// setRetryAfter sets Retry-After to d in whole seconds, rounded up.
func setRetryAfter(w http.ResponseWriter, d time.Duration) {
	w.Header().Set("Retry-After", strconv.Itoa(int((d+time.Second-1)/time.Second)))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	if e, ok := v.(coded); ok {
		w.Header().Set("Tokenguard-Error", e.code())
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
