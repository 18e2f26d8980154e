package tokenguard_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard"
	"github.com/tokenguard/tokenguard/infra/provider/profiles"
	"github.com/tokenguard/tokenguard/internal/sandbox"
)

// A provider that answers a dead grant as GitHub does (HTTP 200
// {"error":"bad_refresh_token"}): with the github profile the connection
// is needs_reauth after one refused request, the hook told once; without
// it (the control, the generic profile) the same answer is transient and
// the grant stays active, which is what the profile fixes.
func TestProfileDeadGrantInTheProvidersWords(t *testing.T) {
	github, err := profiles.Get("github")
	if err != nil {
		t.Fatal(err)
	}
	for _, profile := range []string{"github", "generic"} {
		t.Run(profile, func(t *testing.T) {
			w := newWorld(t, sandbox.Like(github, sandbox.Options{}))
			var hooked atomic.Int32
			var reason atomic.Value
			tg := newTokens(t, w, w.open(t, nil), tokenguard.WithProfile(profile),
				tokenguard.WithLockWait(3*time.Second), tokenguard.WithRefreshTimeout(time.Second),
				tokenguard.WithNeedsReauth(func(_, r string) { hooked.Add(1); reason.Store(r) }))
			ctx := context.Background()
			tok := w.grant(t)
			tok.Expiry = time.Now().Add(-time.Minute) // stale: the next call refreshes
			if err := tg.Import(ctx, "acme", tok); err != nil {
				t.Fatal(err)
			}
			w.provider.RevokeAll()
			_, err := tg.Token(ctx, "acme")
			refused := w.provider.Stats().RefreshRejected
			conns, _, lerr := tg.Connections(ctx, "", 10)
			if lerr != nil || len(conns) != 1 {
				t.Fatalf("connections: %v, %v", conns, lerr)
			}
			switch profile {
			case "github":
				if !errors.Is(err, tokenguard.ErrNeedsReauth) || refused != 1 || hooked.Load() != 1 || reason.Load() != "bad_refresh_token" {
					t.Fatalf("err %v after %d refused request(s), hook %d (%v); want needs_reauth after 1, hook once", err, refused, hooked.Load(), reason.Load())
				}
				if conns[0].Status != "needs_reauth" {
					t.Fatalf("status %q", conns[0].Status)
				}
				if _, err := tg.Token(ctx, "acme"); !errors.Is(err, tokenguard.ErrNeedsReauth) || w.provider.Stats().RefreshRejected != 1 {
					t.Fatalf("second call: %v, %d requests", err, w.provider.Stats().RefreshRejected)
				}
			case "generic":
				if errors.Is(err, tokenguard.ErrNeedsReauth) || !errors.Is(err, tokenguard.ErrProviderUnavailable) || hooked.Load() != 0 || conns[0].Status != "active" {
					t.Fatalf("control: err %v, hook %d, status %q; want provider_unavailable and active", err, hooked.Load(), conns[0].Status)
				}
			}
		})
	}
}

// WithProfile fills what the oauth2.Config leaves unset and refuses what
// cannot work.
func TestWithProfileSettings(t *testing.T) {
	w := newWorld(t, sandbox.Options{})
	db := w.open(t, nil)
	if err := tokenguard.Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	if _, err := tokenguard.New(db, w.oauth, tokenguard.WithProfile("nope")); !errors.Is(err, tokenguard.ErrUnknownProfile) {
		t.Fatalf("unknown profile: %v", err)
	}
	if _, err := tokenguard.New(db, &oauth2.Config{ClientID: "c"}, tokenguard.WithProfile("okta")); err == nil || !strings.Contains(err.Error(), "WithProfileParam for domain") {
		t.Fatalf("okta without a domain nor a token URL: %v, want an error naming WithProfileParam for domain", err)
	}
	if _, err := tokenguard.New(db, w.oauth, tokenguard.WithProfile("okta"), tokenguard.WithProfileParam("tenant", "x")); err == nil {
		t.Fatal("a parameter okta does not take was accepted")
	}
	tg, err := tokenguard.New(db, &oauth2.Config{ClientID: "c"}, tokenguard.WithProfile("okta"), tokenguard.WithProfileParam("domain", "acme.okta.com"))
	if err != nil {
		t.Fatal(err)
	}
	_ = tg.Close(context.Background())
}
