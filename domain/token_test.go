package domain_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func token(lifetime time.Duration) domain.Token {
	return domain.Token{
		Connection:   "acme",
		AccessToken:  domain.NewSecret("at-123"),
		RefreshToken: domain.NewSecret("rt-456"),
		TokenType:    "Bearer",
		ObtainedAt:   t0,
		Expiry:       t0.Add(lifetime),
		Status:       domain.StatusActive,
		Version:      1,
	}
}

func TestFreshAt(t *testing.T) {
	cases := []struct {
		name     string
		tok      domain.Token
		at       time.Time
		skew     time.Duration
		want     bool
		wantSkew time.Duration
	}{
		{"well before expiry", token(time.Hour), t0.Add(10 * time.Minute), 30 * time.Second, true, 30 * time.Second},
		{"inside the skew", token(time.Hour), t0.Add(time.Hour - 29*time.Second), 30 * time.Second, false, 30 * time.Second},
		{"exactly at expiry minus skew", token(time.Hour), t0.Add(time.Hour - 30*time.Second), 30 * time.Second, false, 30 * time.Second},
		{"expired", token(time.Hour), t0.Add(2 * time.Hour), 30 * time.Second, false, 30 * time.Second},
		// A skew longer than the lifetime is capped at half of it, so the
		// token is still reused for the first half.
		{"skew longer than lifetime, first half", token(10 * time.Second), t0.Add(4 * time.Second), time.Minute, true, 5 * time.Second},
		{"skew longer than lifetime, second half", token(10 * time.Second), t0.Add(6 * time.Second), time.Minute, false, 5 * time.Second},
		{"zero skew", token(time.Second), t0.Add(999 * time.Millisecond), 0, true, 0},
		{"no expiry", func() domain.Token { tk := token(0); tk.Expiry = time.Time{}; return tk }(), t0.Add(1000 * time.Hour), time.Minute, true, time.Minute},
		{"needs reauth", func() domain.Token { tk := token(time.Hour); tk.Status = domain.StatusNeedsReauth; return tk }(), t0, 0, false, 0},
		{"no access token", func() domain.Token { tk := token(time.Hour); tk.AccessToken = domain.Secret{}; return tk }(), t0, 0, false, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := c.tok.FreshAt(c.at, c.skew); got != c.want {
				t.Errorf("FreshAt = %v, want %v", got, c.want)
			}
			if got := c.tok.EffectiveSkew(c.skew); got != c.wantSkew {
				t.Errorf("EffectiveSkew = %v, want %v", got, c.wantSkew)
			}
		})
	}
}

func TestRotatedKeepsRefreshTokenWhenProviderSendsNone(t *testing.T) {
	tok := token(time.Hour)
	tok.Status, tok.StatusReason = domain.StatusNeedsReauth, "invalid_grant"
	now := t0.Add(time.Hour)
	got := tok.Rotated(domain.Grant{AccessToken: domain.NewSecret("at-new"), TokenType: "Bearer", Expiry: now.Add(time.Hour)}, now)
	if got.RefreshToken.Reveal() != "rt-456" {
		t.Errorf("refresh token replaced by an empty one")
	}
	if got.AccessToken.Reveal() != "at-new" || !got.ObtainedAt.Equal(now) || got.Status != domain.StatusActive || got.StatusReason != "" {
		t.Errorf("rotated token = %+v", got)
	}
	got = tok.Rotated(domain.Grant{AccessToken: domain.NewSecret("at-2"), RefreshToken: domain.NewSecret("rt-2")}, now)
	if got.RefreshToken.Reveal() != "rt-2" {
		t.Errorf("rotated refresh token not taken")
	}
}

func TestRotatedRefreshExpiry(t *testing.T) {
	now := t0.Add(time.Hour)
	known := now.Add(90 * 24 * time.Hour)
	later := known.Add(24 * time.Hour)
	at := domain.NewSecret("at-new")
	cases := []struct {
		name   string
		stored time.Time
		grant  domain.Grant
		want   time.Time
		wantRT string
	}{
		{"provider names it", time.Time{}, domain.Grant{AccessToken: at, RefreshToken: domain.NewSecret("rt-2"), RefreshExpiry: known}, known, "rt-2"},
		{"provider renews it without rotating", known, domain.Grant{AccessToken: at, RefreshExpiry: later}, later, "rt-456"},
		{"no rotation, not named: kept", known, domain.Grant{AccessToken: at}, known, "rt-456"},
		{"same refresh token again, not named: kept", known, domain.Grant{AccessToken: at, RefreshToken: domain.NewSecret("rt-456")}, known, "rt-456"},
		{"rotated, not named: unknown", known, domain.Grant{AccessToken: at, RefreshToken: domain.NewSecret("rt-2")}, time.Time{}, "rt-2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tok := token(time.Hour)
			tok.RefreshExpiry = c.stored
			got := tok.Rotated(c.grant, now)
			if !got.RefreshExpiry.Equal(c.want) || got.RefreshToken.Reveal() != c.wantRT {
				t.Errorf("refresh expiry %v, refresh token %q; want %v, %q", got.RefreshExpiry, got.RefreshToken.Reveal(), c.want, c.wantRT)
			}
		})
	}
	g := domain.Grant{AccessToken: at, RefreshToken: domain.NewSecret("r"), RefreshExpiry: known}
	if tok, err := domain.NewToken("acme", g, now); err != nil || !tok.RefreshExpiry.Equal(known) {
		t.Errorf("NewToken = %v, %v; want refresh expiry %v", tok.RefreshExpiry, err, known)
	}
}

func TestNewTokenRejectsUnusableGrants(t *testing.T) {
	ok := domain.Grant{AccessToken: domain.NewSecret("a"), RefreshToken: domain.NewSecret("r")}
	if tok, err := domain.NewToken("acme", ok, t0); err != nil || tok.TokenType != "Bearer" {
		t.Fatalf("NewToken = %+v, %v", tok, err)
	}
	for name, g := range map[string]domain.Grant{
		"no refresh token": {AccessToken: domain.NewSecret("a")},
		"no access token":  {RefreshToken: domain.NewSecret("r")},
	} {
		if _, err := domain.NewToken("acme", g, t0); !errors.Is(err, domain.ErrInvalidToken) {
			t.Errorf("%s: err = %v, want ErrInvalidToken", name, err)
		}
	}
	for _, bad := range []string{"", "-x", "a b", "a/b", strings.Repeat("a", 129), "é"} {
		if _, err := domain.NewToken(bad, ok, t0); !errors.Is(err, domain.ErrInvalidConnection) {
			t.Errorf("NewToken(%q) err = %v, want ErrInvalidConnection", bad, err)
		}
	}
}

func TestSecretsNeverPrint(t *testing.T) {
	tok := token(time.Hour)
	var outputs []string
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d"} {
		outputs = append(outputs, fmt.Sprintf(verb, tok), fmt.Sprintf(verb, &tok), fmt.Sprintf(verb, tok.AccessToken))
	}
	outputs = append(outputs, fmt.Sprint(tok), fmt.Sprintln(tok.RefreshToken))
	js, err := json.Marshal(tok)
	if err != nil {
		t.Fatal(err)
	}
	outputs = append(outputs, string(js))
	for _, h := range []func(*bytes.Buffer) slog.Handler{
		func(b *bytes.Buffer) slog.Handler { return slog.NewJSONHandler(b, nil) },
		func(b *bytes.Buffer) slog.Handler { return slog.NewTextHandler(b, nil) },
	} {
		var buf bytes.Buffer
		slog.New(h(&buf)).Info("x", "token", tok, "secret", tok.AccessToken, "any", any(tok.RefreshToken))
		outputs = append(outputs, buf.String())
	}
	for _, out := range outputs {
		if strings.Contains(out, "at-123") || strings.Contains(out, "rt-456") ||
			strings.Contains(out, fmt.Sprintf("%x", "at-123")) {
			t.Errorf("secret leaked: %s", out)
		}
	}
	if !strings.Contains(fmt.Sprint(tok), "[REDACTED]") {
		t.Errorf("expected a redaction marker in %v", tok)
	}
}

func TestProviderErrorMatchesItsKind(t *testing.T) {
	perm := &domain.ProviderError{Code: "invalid_grant", HTTPStatus: 400, Class: domain.GrantDead}
	if !errors.Is(perm, domain.ErrGrantRevoked) || errors.Is(perm, domain.ErrProviderUnavailable) {
		t.Errorf("permanent error kinds wrong")
	}
	cause := errors.New("connection refused")
	tr := &domain.ProviderError{Err: cause}
	if !errors.Is(tr, domain.ErrProviderUnavailable) || !errors.Is(tr, cause) || errors.Is(tr, domain.ErrGrantRevoked) {
		t.Errorf("transient error kinds wrong")
	}
	if got := perm.Error(); got != "token refresh failed: invalid_grant (HTTP 400)" {
		t.Errorf("Error() = %q", got)
	}
}

// fmt prints an unexported field without calling its methods; a Secret in
// one must still not show its value.
func TestSecretInUnexportedFieldNeverPrints(t *testing.T) {
	type holder struct {
		name   string
		secret domain.Secret
	}
	h := holder{name: "x", secret: domain.NewSecret("rt-unexported")}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%x"} {
		if out := fmt.Sprintf(verb, h); strings.Contains(out, "rt-unexported") || strings.Contains(out, fmt.Sprintf("%x", "rt-unexported")) {
			t.Errorf("%s leaked the secret: %s", verb, out)
		}
	}
	if !h.secret.Equal(domain.NewSecret("rt-unexported")) || h.secret.Reveal() != "rt-unexported" {
		t.Errorf("Equal/Reveal broken")
	}
	if !domain.NewSecret("").IsZero() || domain.NewSecret("").Reveal() != "" {
		t.Errorf("empty secret not zero")
	}
}

// A refresh token that dies on the grant's calendar keeps its stored
// expiry across a rotation whose answer names none; a failure episode
// ends with the rotation.
func TestRotatedKeepsTheGrantsCalendar(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cal := now.Add(365 * 24 * time.Hour)
	old := domain.Token{RefreshToken: domain.NewSecret("rt-1"), RefreshExpiry: cal, Status: domain.StatusActive,
		Failure: domain.RefreshFailure{Failures: 2, Failing: true}}
	got := old.Rotated(domain.Grant{AccessToken: domain.NewSecret("at"), RefreshToken: domain.NewSecret("rt-2"), KeepRefreshExpiry: true}, now)
	if !got.RefreshExpiry.Equal(cal) || got.Failure != (domain.RefreshFailure{}) {
		t.Errorf("rotated: refresh expiry %v, failure %+v", got.RefreshExpiry, got.Failure)
	}
	// The control: without it a new refresh token's expiry is unknown.
	if got := old.Rotated(domain.Grant{AccessToken: domain.NewSecret("at"), RefreshToken: domain.NewSecret("rt-2")}, now); !got.RefreshExpiry.IsZero() {
		t.Errorf("rotated without the calendar: refresh expiry %v, want unknown", got.RefreshExpiry)
	}
}

func TestRotatedRecordsScopesReduced(t *testing.T) {
	now := t0.Add(time.Hour)
	at := domain.NewSecret("at-new")
	cases := []struct {
		name             string
		granted, before  string // the connect time's scopes, the reduction stored
		grant            domain.Grant
		answered, lacked string
	}{
		{"fewer scopes", "api read write", "", domain.Grant{AccessToken: at, Scope: "api", ScopeNamed: true}, "api", "read write"},
		{"comma-separated (GitHub)", "repo,user", "", domain.Grant{AccessToken: at, Scope: "repo", ScopeNamed: true}, "repo", "user"},
		{"the same scopes in another order", "api read", "", domain.Grant{AccessToken: at, Scope: "read api", ScopeNamed: true}, "read api", ""},
		{"more scopes", "api", "", domain.Grant{AccessToken: at, Scope: "api read", ScopeNamed: true}, "api read", ""},
		{"named empty: every scope lacked", "api read", "", domain.Grant{AccessToken: at, Scope: "", ScopeNamed: true}, "", "api read"},
		// RFC 6749 §5.1: an answer without scope granted what was asked.
		{"not named: unchanged", "api read", "", domain.Grant{AccessToken: at}, "", ""},
		{"not named after a reduction: still reduced", "api read", "read", domain.Grant{AccessToken: at}, "", "read"},
		{"restored", "api read", "read", domain.Grant{AccessToken: at, Scope: "api read", ScopeNamed: true}, "api read", ""},
		// Granted scopes unknown (an import without scope, a row from an
		// earlier release): never reduced.
		{"granted unknown", "", "", domain.Grant{AccessToken: at, Scope: "api", ScopeNamed: true}, "api", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tok := token(time.Hour)
			tok.Binding = domain.Binding{Account: "u1", Scopes: c.granted, ScopesReduced: c.before}
			got := tok.Rotated(c.grant, now).Binding
			if got.ScopesReduced != c.lacked || (c.grant.ScopeNamed && got.Answered != c.answered) {
				t.Errorf("binding %+v, want answered %q, scopes reduced %q", got, c.answered, c.lacked)
			}
			if got.Account != "u1" || got.Scopes != c.granted {
				t.Errorf("binding %+v: the grant's account and scopes changed", got)
			}
		})
	}
}
