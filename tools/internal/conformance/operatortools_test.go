package conformance_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/di"
	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/infra/provider/profiles"
)

// TestOperatorToolsWithClientKey: with the OAUTH_* provider authenticated
// by private_key_jwt (OAUTH_CLIENT_KEY_FILE), tokenctl check finds the
// client accepted at oidc-provider, and tokenctl disconnect --revoke
// revokes the connection's refresh token with an assertion signed by that
// key: the refresh token is dead, the connection deleted. Controls: the
// same check and revocation without the key (what the operator tools sent
// before) are refused as a client, and the refresh token still works.
func TestOperatorToolsWithClientKey(t *testing.T) {
	w, priv, k := newKeyWorld(t)
	tg := w.stacks[0]
	w.connect(t, tg, "op-revoked")
	w.connect(t, tg, "op-control")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	keyed := provider.ClientOptions("", k, profiles.Profile{}, nil)
	refresher := provider.NewRefresher(w.cfg, provider.NewHTTPClient(10*time.Second), keyed...)
	revocations := func(status int) func(map[string]any) bool {
		return func(ev map[string]any) bool {
			return ev["event"] == "revocation" && ev["client_id"] == "pkjwt" && ev["status"] == float64(status)
		}
	}

	der, _ := x509.MarshalPKCS8PrivateKey(priv)
	keyFile := filepath.Join(t.TempDir(), "client.pem")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	environ := []string{"DATABASE_URL=" + w.dsn, "OAUTH_TOKEN_URL=" + w.d.Token, "OAUTH_CLIENT_ID=pkjwt",
		"OAUTH_AUTH_STYLE=private_key_jwt", "OAUTH_CLIENT_KEY_FILE=" + keyFile, "OAUTH_REVOCATION_URL=" + w.d.Revocation}
	tokenctl := func(args ...string) (int, string) {
		var stdout, stderr bytes.Buffer
		code := di.RunTokenctl(args, environ, strings.NewReader(""), &stdout, &stderr)
		return code, stdout.String() + stderr.String()
	}

	t.Run("tokenctl check", func(t *testing.T) {
		if code, out := tokenctl("check"); code != 0 || !strings.HasPrefix(out, "ok: ") {
			t.Errorf("tokenctl check: exit %d, %s", code, out)
		}
		if res := provider.Check(ctx, w.cfg, provider.NewHTTPClient(10*time.Second)); res.Verdict != provider.CheckClientRejected {
			t.Errorf("control: the check without the key: %s, want client rejected", res)
		}
	})

	t.Run("control: a revocation without the key, refused", func(t *testing.T) {
		stored, err := tg.Repository().Get(ctx, "op-control")
		if err != nil {
			t.Fatal(err)
		}
		keyless := provider.NewRevocations(provider.RevocationEndpoint{URL: w.d.Revocation, ClientID: "pkjwt",
			AuthStyle: oauth2.AuthStyleInParams, TokenURL: w.d.Token}, nil, nil, provider.NewHTTPClient(10*time.Second), nil)
		if err := keyless.Revoke(ctx, "", stored.RefreshToken); err == nil {
			t.Fatal("a revocation without the client key was accepted")
		}
		if n := w.eventsUpTo(1, revocations(401)); n < 1 {
			t.Errorf("revocations refused as a client: %d, want at least 1", n)
		}
		if _, err := refresher.Refresh(ctx, stored.RefreshToken); err != nil {
			t.Errorf("the refresh token the refused revocation carried: %v, want it alive", err)
		}
	})

	t.Run("tokenctl disconnect --revoke", func(t *testing.T) {
		stored, err := tg.Repository().Get(ctx, "op-revoked")
		if err != nil {
			t.Fatal(err)
		}
		if code, out := tokenctl("disconnect", "--connection", "op-revoked", "--revoke"); code != 0 || !strings.Contains(out, "was revoked at the provider") {
			t.Fatalf("tokenctl disconnect --revoke: exit %d, %s", code, out)
		}
		if n := w.eventsUpTo(1, func(ev map[string]any) bool {
			return revocations(200)(ev) && ev["assertion_aud"] == w.d.Token
		}); n != 1 {
			t.Errorf("revocations accepted, with an assertion for the token endpoint: %d, want 1", n)
		}
		var pe *domain.ProviderError
		if _, err := refresher.Refresh(ctx, stored.RefreshToken); !errors.As(err, &pe) || pe.Code != "invalid_grant" {
			t.Errorf("the revoked refresh token: %v, want invalid_grant", err)
		}
		if _, err := tg.Repository().Get(ctx, "op-revoked"); !errors.Is(err, domain.ErrNotFound) {
			t.Errorf("the disconnected connection: %v, want ErrNotFound", err)
		}
	})
}
