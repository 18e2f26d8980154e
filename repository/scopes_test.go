package repository_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// refreshWith stores the connection's next token as a refresh whose
// answer names scope (named) or none.
func refreshWith(t *testing.T, r *repository.TokenRepository, conn, scope string, named bool) domain.Token {
	t.Helper()
	ctx := context.Background()
	cur, err := r.Get(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	g := domain.Grant{AccessToken: domain.NewSecret("at-" + scope), RefreshToken: domain.NewSecret("rt-" + time.Now().String()),
		Expiry: time.Now().Add(time.Hour), Scope: scope, ScopeNamed: named}
	out, err := r.Store(ctx, cur.Rotated(g, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// scopeEvents are the connection.scopes_reduced events in the outbox.
func scopeEvents(t *testing.T, db *gorm.DB) []string {
	t.Helper()
	var data []string
	if err := db.Raw(`SELECT data::text FROM tokenguard_webhook_outbox WHERE type = 'connection.scopes_reduced' ORDER BY id`).Scan(&data).Error; err != nil {
		t.Fatal(err)
	}
	return data
}

// TestScopesReducedOncePerReduction: a refresh that grants fewer scopes
// than the connect time's is stored with the answer's scope and the
// missing ones, shown in the listing, and written as one
// connection.scopes_reduced event in the transaction that stores it; the
// next refreshes with the same reduction, or without scope (RFC 6749 §5.1:
// unchanged), add none. A new grant clears it. Controls: granted scopes
// unknown (an import without scope) are never reduced, and with the
// trigger's dedupe removed every refresh would announce it again.
func TestScopesReducedOncePerReduction(t *testing.T) {
	r, db, _ := newRepo(t)
	ctx := context.Background()
	connect := usecase.NewConnectUseCase(r, nil, time.Second)
	if _, err := connect.ConnectGrant(ctx, "acme", domain.Grant{AccessToken: domain.NewSecret("at-0"), RefreshToken: domain.NewSecret("rt-0"),
		Expiry: time.Now().Add(time.Hour)}, usecase.ConnectRequest{Binding: domain.Binding{Account: "u1", Scopes: "api read write"}, AllowAccountChange: true}); err != nil {
		t.Fatal(err)
	}

	if got := refreshWith(t, r, "acme", "api read write", true); got.Binding.ScopesReduced != "" {
		t.Errorf("equal scope: reduced %q", got.Binding.ScopesReduced)
	}
	if n := len(scopeEvents(t, db)); n != 0 {
		t.Errorf("equal scope: %d events", n)
	}
	got := refreshWith(t, r, "acme", "api", true)
	if got.Binding.ScopesReduced != "read write" || got.Binding.Answered != "api" || got.Status != domain.StatusActive {
		t.Errorf("fewer scopes: %+v, status %s", got.Binding, got.Status)
	}
	events := scopeEvents(t, db)
	if len(events) != 1 || !strings.Contains(events[0], `"scopes_reduced": ["read", "write"]`) || !strings.Contains(events[0], `"scopes": ["api"]`) ||
		!strings.Contains(events[0], `"granted_scopes": ["api", "read", "write"]`) {
		t.Fatalf("after the reduction: %q", events)
	}
	if strings.Contains(events[0], "at-") || strings.Contains(events[0], "rt-") {
		t.Errorf("the event carries a token: %s", events[0])
	}
	c, err := r.Connection(ctx, "acme")
	if err != nil || c.Binding.ScopesReduced != "read write" || c.Status != domain.StatusActive {
		t.Errorf("listing: %+v %s, %v", c.Binding, c.Status, err)
	}

	refreshWith(t, r, "acme", "api", true)       // the same reduction
	got = refreshWith(t, r, "acme", "", false)   // no scope: unchanged
	refreshWith(t, r, "acme", "write api", true) // a scope back: less reduced
	if got.Binding.ScopesReduced != "read write" {
		t.Errorf("answer without scope: reduced %q, want it unchanged", got.Binding.ScopesReduced)
	}
	if n := len(scopeEvents(t, db)); n != 1 {
		t.Errorf("%d scopes_reduced events after the same reduction again, want 1", n)
	}
	refreshWith(t, r, "acme", "api", true) // write missing again: a new reduction
	if n := len(scopeEvents(t, db)); n != 2 {
		t.Errorf("%d scopes_reduced events after a scope went missing again, want 2", n)
	}

	if _, err := connect.ConnectGrant(ctx, "acme", domain.Grant{AccessToken: domain.NewSecret("at-9"), RefreshToken: domain.NewSecret("rt-9"),
		Expiry: time.Now().Add(time.Hour)}, usecase.ConnectRequest{Binding: domain.Binding{Account: "u1", Scopes: "api read write"}, AllowAccountChange: true}); err != nil {
		t.Fatal(err)
	}
	if c, _ := r.Connection(ctx, "acme"); c.Binding.ScopesReduced != "" {
		t.Errorf("after a new grant: reduced %q", c.Binding.ScopesReduced)
	}

	t.Run("granted scopes unknown: never reduced", func(t *testing.T) {
		put(t, r, grantToken("imported", "at-i", "rt-i"))
		if got := refreshWith(t, r, "imported", "api", true); got.Binding.ScopesReduced != "" || got.Binding.Answered != "api" {
			t.Errorf("binding %+v", got.Binding)
		}
		if n := len(scopeEvents(t, db)); n != 2 {
			t.Errorf("%d scopes_reduced events, want still 2", n)
		}
	})

	t.Run("control: without the dedupe every refresh announces it", func(t *testing.T) {
		if err := db.Exec(`DROP TRIGGER tokenguard_tokens_scopes_reduced ON tokenguard_tokens;
CREATE TRIGGER tokenguard_tokens_scopes_reduced AFTER UPDATE OF scopes_reduced ON tokenguard_tokens
FOR EACH ROW WHEN (cardinality(NEW.scopes_reduced) > 0) EXECUTE FUNCTION tokenguard_scopes_reduced_outbox()`).Error; err != nil {
			t.Fatal(err)
		}
		db.Exec("DELETE FROM tokenguard_webhook_outbox")
		refreshWith(t, r, "acme", "api", true)
		refreshWith(t, r, "acme", "api", true)
		if n := len(scopeEvents(t, db)); n != 2 {
			t.Errorf("%d events for one reduction refreshed twice without the dedupe, want 2", n)
		}
	})
}
