package domain

import (
	"errors"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Scope is one thing an API key may do; every route names the one it needs.
type Scope string

// The scopes of API keys.
const (
	ScopeConnectionsRead Scope = "connections:read" // list connections and read their status
	ScopeTokenRead       Scope = "token:read"       // read a connection's access token (and force a newer one)
	ScopeAPICall         Scope = "api:call"         // proxy a connection's API calls, queue its events
	ScopeConnect         Scope = "connect"          // create connect sessions and redeem their results
	ScopeAdmin           Scope = "admin"            // metrics, account-changing sessions, disconnecting
)

// AllScopes are the scopes there are, in the order they are documented.
var AllScopes = []Scope{ScopeConnectionsRead, ScopeTokenRead, ScopeAPICall, ScopeConnect, ScopeAdmin}

// Errors of API keys; nothing was stored or done.
var (
	ErrKeyExists            = errors.New("an API key with that name exists")
	ErrInvalidKeyAccess     = errors.New("invalid API key scopes or connection patterns")
	ErrMissingScope         = errors.New("the API key lacks the scope") // the action needs
	ErrConnectionNotAllowed = errors.New("the API key's connection patterns do not match the connection")
)

// APIKey is a stored key as an operator sees it: never the key itself.
type APIKey struct {
	KeyAccess  // its ID, name and what it may do
	CreatedAt  time.Time
	LastUsedAt *time.Time
}

// MaxPatternLength bounds one connection pattern of an API key.
const MaxPatternLength = 128

// KeyAccess is an API key and what it may do; a nil field allows everything.
type KeyAccess struct {
	ID          int32
	Name        string
	Scopes      []Scope  // nil: every scope
	Connections []string // glob patterns (path.Match); nil: every connection
}

// Has reports whether the key holds scope s.
func (a KeyAccess) Has(s Scope) bool {
	return a.Scopes == nil || slices.Contains(a.Scopes, s)
}

// AllowsConnection reports whether one of the key's patterns matches name.
func (a KeyAccess) AllowsConnection(name string) bool {
	return a.Connections == nil || slices.ContainsFunc(a.Connections, func(p string) bool {
		ok, err := path.Match(p, name)
		return err == nil && ok
	})
}

// Permit is the one authorization rule of every surface that acts for a key: it must hold scope s
// and, unless connection is "" (a listing, filtered by AllowsConnection), a pattern matching it.
func (a KeyAccess) Permit(s Scope, connection string) error {
	if !slices.Contains(AllScopes, s) || !a.Has(s) {
		return fmt.Errorf("%w %s", ErrMissingScope, s)
	}
	if connection != "" && !a.AllowsConnection(connection) {
		return fmt.Errorf("%w %s", ErrConnectionNotAllowed, connection)
	}
	return nil
}

// ParseScopes reads scope names without repeats; errors give an unknown one's position, not its text (a command line's).
func ParseScopes(names []string) ([]Scope, error) {
	out := make([]Scope, 0, len(names))
	for i, n := range names {
		s := Scope(strings.TrimSpace(n))
		if !slices.Contains(AllScopes, s) {
			return nil, fmt.Errorf("%w: scope %d is not one of %s", ErrInvalidKeyAccess, i+1, joinScopes(AllScopes))
		}
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no scope given (want some of %s)", ErrInvalidKeyAccess, joinScopes(AllScopes))
	}
	return out, nil
}

// ValidateConnectionPattern checks one connection pattern: printable ASCII, no comma, a path.Match glob.
func ValidateConnectionPattern(p string) error {
	if p == "" || len(p) > MaxPatternLength {
		return fmt.Errorf("%w: a connection pattern is 1-%d characters", ErrInvalidKeyAccess, MaxPatternLength)
	}
	if strings.ContainsFunc(p, func(r rune) bool { return r <= ' ' || r > '~' || r == ',' }) {
		return fmt.Errorf("%w: a connection pattern is printable ASCII without spaces or commas", ErrInvalidKeyAccess)
	}
	if _, err := path.Match(p, ""); err != nil {
		return fmt.Errorf("%w: a connection pattern is a glob (* ? [a-z]); this one is malformed", ErrInvalidKeyAccess)
	}
	return nil
}

// MatchesNoName reports whether pattern p needs a character names never have, such as '/'.
func MatchesNoName(p string) bool { return notNameOrWildcard.MatchString(p) }

// notNameOrWildcard is a character neither of names nor of path.Match's syntax.
var notNameOrWildcard = regexp.MustCompile(`[^A-Za-z0-9._\-*?\[\]^!]`)

func joinScopes(s []Scope) string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = string(v)
	}
	return strings.Join(out, ", ")
}
