package domain

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Status says whether a connection's grant can still be refreshed.
type Status string

const (
	StatusActive      Status = "active"
	StatusNeedsReauth Status = "needs_reauth"
	// StatusFailing: how listings show an active connection whose refreshes keep failing; never stored.
	StatusFailing Status = "failing"
)

// RefreshFailure is a connection's episode of failed refreshes, shared through the store; zero: none.
type RefreshFailure struct {
	Failures int       // in a row; 0: no failure
	Since    time.Time // the first of them
	LastAt   time.Time // the last of them
	// RetryAt: no refresh before it. Zero with Failures > 0: none at all
	// until a new grant (a lost answer's refresh token may not be replayed).
	RetryAt     time.Time
	ReplayUntil time.Time // ends the reuse grace window after a lost answer; zero: no bound
	HTTPStatus  int       // of the last answer; 0: none came
	Code        string    // of the last answer, as errors report it
	Failing     bool      // shown as failing (connection.refresh_failing sent)
}

// Blocked reports whether no refresh may be attempted: the refresh token may be spent and not presented again.
func (f RefreshFailure) Blocked(now time.Time) bool {
	return f.Failures > 0 && (f.RetryAt.IsZero() || (!f.ReplayUntil.IsZero() && !now.Before(f.ReplayUntil)))
}

// CodeAnswerLost is the code of a failure episode opened by a request that
// presented the refresh token and got no answer (or whose holder vanished).
const CodeAnswerLost = "answer_lost"

// ProbeFirst reports whether the provider must answer before the refresh token is presented again: the
// last answer was lost at a provider with no known reuse grace, so our request may be queued there.
func (f RefreshFailure) ProbeFirst() bool {
	return f.Failures > 0 && f.Code == CodeAnswerLost && f.ReplayUntil.IsZero() && !f.RetryAt.IsZero()
}

// Describe is the failure as listings show it (no secret).
func (f RefreshFailure) Describe() string {
	if f.Failures == 0 {
		return ""
	}
	s := cmp.Or(f.Code, "no code")
	if f.HTTPStatus != 0 {
		s = fmt.Sprintf("HTTP %d %s", f.HTTPStatus, s)
	}
	return fmt.Sprintf("%s, %d in a row since %s", s, f.Failures, f.Since.UTC().Format(time.RFC3339))
}

// Token is one connection's stored OAuth2 token; printing it never shows its Secrets.
type Token struct {
	Connection    string
	AccessToken   Secret
	TokenType     string
	RefreshToken  Secret
	Expiry        time.Time // zero means the provider gave no expiry
	RefreshExpiry time.Time // when RefreshToken stops working; zero: unknown
	ObtainedAt    time.Time // when AccessToken was issued; bounds the refresh skew
	Version       int64     // bumped by every write; never goes back
	Status        Status
	StatusReason  string // why the connection needs re-authorisation, if it does
	UpdatedAt     time.Time
	Binding       Binding        // who granted it; zero for grants imported without an account
	Provider      string         // the stored provider that issued the grant; "" is OAUTH_*'s
	Failure       RefreshFailure // this version's failure episode (read with the token, never written)
	DPoPJKT       string         // RFC 7638 thumbprint of the DPoP key the grant is useless without; "" for bearer
	DPoPKey       Secret         // that key's PEM, set only on a new grant on its way to the store
}

// SenderConstrained reports whether the grant is DPoP-bound: its access token is useless without a proof.
func (t Token) SenderConstrained() bool { return t.DPoPJKT != "" }

// Binding is who granted a connection and what; space-separated scopes (RFC 6749 §3.3) keep Token comparable.
type Binding struct {
	Account       string // the consenting account's provider id; "" when unknown
	Scopes        string // granted; "" when unknown
	MissingScopes string // requested (OAUTH_SCOPES) but not granted
	Answered      string // the scope the latest refresh answer named; "" when none did since the grant (§5.1: unchanged)
	ScopesReduced string // the granted Scopes that Answered lacks; the grant stays usable
}

// ScopeFields splits a token answer's scope: space-separated (RFC 6749 §3.3), or comma-separated (GitHub).
func ScopeFields(scope string) []string {
	return strings.Fields(strings.ReplaceAll(scope, ",", " "))
}

// Grant is what a provider hands out: a fresh access token and possibly a new refresh token.
type Grant struct {
	AccessToken       Secret
	TokenType         string
	RefreshToken      Secret // zero when the provider did not rotate
	Expiry            time.Time
	RefreshExpiry     time.Time         // when the refresh token expires, if the provider said; else zero
	KeepRefreshExpiry bool              // the refresh token dies on the grant's calendar: its expiry holds once rotated
	Scope             string            // the scope the answer named, if ScopeNamed
	ScopeNamed        bool              // without, the scope is what was asked (RFC 6749 §5.1)
	Extra             map[string]string // answer fields the profile keeps (Salesforce instance_url); never a credential
}

// EffectiveSkew caps skew at half the granted lifetime, so that a longer skew cannot make every call a refresh.
func (t Token) EffectiveSkew(skew time.Duration) time.Duration {
	if half := t.Expiry.Sub(t.ObtainedAt) / 2; half >= 0 && !t.Expiry.IsZero() && !t.ObtainedAt.IsZero() {
		return min(skew, half)
	}
	return skew
}

// FreshAt reports whether the connection is active and its access token outlives now by the skew.
func (t Token) FreshAt(now time.Time, skew time.Duration) bool {
	if t.Status != StatusActive || t.AccessToken.IsZero() {
		return false
	}
	return t.Expiry.IsZero() || now.Before(t.Expiry.Add(-t.EffectiveSkew(skew)))
}

// Rotated returns t carrying g, issued at now. The refresh token and its expiry
// are kept when the provider sent no new one (RFC 6749 §6).
func (t Token) Rotated(g Grant, now time.Time) Token {
	switch {
	case !g.RefreshExpiry.IsZero():
		t.RefreshExpiry = g.RefreshExpiry
	case g.KeepRefreshExpiry:
	case !g.RefreshToken.IsZero() && !g.RefreshToken.Equal(t.RefreshToken):
		t.RefreshExpiry = time.Time{}
	}
	t.AccessToken = g.AccessToken
	t.TokenType = g.TokenType
	if !g.RefreshToken.IsZero() {
		t.RefreshToken = g.RefreshToken
	}
	t.Expiry = g.Expiry
	if g.ScopeNamed {
		answered := ScopeFields(g.Scope)
		var lack []string
		for _, s := range ScopeFields(t.Binding.Scopes) {
			if !slices.Contains(answered, s) && !slices.Contains(lack, s) {
				lack = append(lack, s)
			}
		}
		t.Binding.Answered, t.Binding.ScopesReduced = strings.Join(answered, " "), strings.Join(lack, " ")
	}
	t.ObtainedAt = now
	t.Status = StatusActive
	t.StatusReason = ""
	t.Failure = RefreshFailure{}
	return t
}

// NewToken builds the token of a freshly granted connection.
func NewToken(connection string, g Grant, now time.Time) (Token, error) {
	if err := ValidateName(connection); err != nil {
		return Token{}, err
	}
	if g.AccessToken.IsZero() {
		return Token{}, fmt.Errorf("%w: access token is empty", ErrInvalidToken)
	}
	if g.RefreshToken.IsZero() {
		// Without one, the connection would silently die at its first expiry.
		return Token{}, fmt.Errorf("%w: refresh token is empty", ErrInvalidToken)
	}
	g.TokenType = cmp.Or(g.TokenType, "Bearer")
	return Token{Connection: connection}.Rotated(g, now), nil
}

// LogValue shows what operators need and no credential.
func (t Token) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("connection", t.Connection),
		slog.Int64("version", t.Version),
		slog.String("status", string(t.Status)),
		slog.Time("expiry", t.Expiry),
	)
}

var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// ValidateName accepts names safe in URLs, logs and command lines.
func ValidateName(id string) error {
	if !namePattern.MatchString(id) {
		return fmt.Errorf("%w: %q (want 1-128 of A-Z a-z 0-9 . _ -, starting with a letter or digit)", ErrInvalidConnection, id)
	}
	return nil
}

// MaxAccountLength bounds a provider account id (Binding.Account).
const MaxAccountLength = 255

// ErrInvalidAccount: a provider's account id is too long or not printable. Nothing was stored.
var ErrInvalidAccount = errors.New("invalid provider account id")

// ValidateAccount checks a provider account id before it is stored or printed:
// at most MaxAccountLength bytes of printable UTF-8. The error does not repeat it.
func ValidateAccount(id string) error {
	if len(id) > MaxAccountLength {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrInvalidAccount, len(id), MaxAccountLength)
	}
	if !utf8.ValidString(id) {
		return fmt.Errorf("%w: not UTF-8", ErrInvalidAccount)
	}
	if strings.ContainsFunc(id, func(r rune) bool { return !unicode.IsPrint(r) }) {
		return fmt.Errorf("%w: it has a control or non-printable character", ErrInvalidAccount)
	}
	return nil
}
