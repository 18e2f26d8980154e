package conformance

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Resource is a protected API in front of an authorization server that
// keeps no API of its own: every request's bearer token is checked by the
// server's introspection endpoint (RFC 7662), and a token the server no
// longer considers active (expired, revoked by a refresh, or by a revoked
// grant) is answered 401 with WWW-Authenticate: Bearer
// error="invalid_token" (RFC 6750 §3.1), like a resource server does.
type Resource struct {
	IntrospectionURL string
	ClientID, Secret string // the resource server's credentials (HTTP Basic)
	Client           *http.Client
}

// Path is where Resource answers.
const Path = "/resource"

func (r *Resource) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	scheme, token, ok := strings.Cut(req.Header.Get("Authorization"), " ")
	if req.URL.Path != Path {
		http.NotFound(w, req)
		return
	}
	active := false
	if ok && strings.EqualFold(scheme, "Bearer") && token != "" {
		var err error
		if active, err = r.introspect(req.Context(), token); err != nil {
			http.Error(w, `{"error":"introspection_failed"}`, http.StatusBadGateway)
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	if !active {
		w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"error":"invalid_token"}`))
		return
	}
	_, _ = w.Write([]byte(`{"ok":true}`))
}

func (r *Resource) introspect(ctx context.Context, token string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	form := url.Values{"token": {token}, "token_type_hint": {"access_token"}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.IntrospectionURL, strings.NewReader(form.Encode()))
	if err != nil {
		return false, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	req.SetBasicAuth(url.QueryEscape(r.ClientID), url.QueryEscape(r.Secret))
	c := r.Client
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, &statusError{resp.StatusCode}
	}
	var body struct {
		Active bool `json:"active"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return false, err
	}
	return body.Active, nil
}

type statusError struct{ status int }

func (e *statusError) Error() string { return "introspection answered " + http.StatusText(e.status) }
