package conformance_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/tokenguard/tokenguard"
	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/clientkey"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/repository"
)

// TestDPoPPushedAuthorizationClientKey: oidc-provider requires pushed
// authorization requests (RFC 9126; its metadata says so). tokenguard's
// connect flow, PAR auto, pushes the request authenticated with
// private_key_jwt, with PKCE S256 and dpop_jkt; the browser gets only
// client_id and request_uri; the code exchange proves the named key and
// the DPoP-bound grant refreshes; the disconnect's revocation carries a
// proof. The assertions' aud is the token endpoint (generic profile) for
// the OAUTH_* provider, and the issuer for a stored provider whose profile
// says so (auth0), whose key the JWKS serves too. Control: the same flow
// with PAR never is refused by the server at the authorization endpoint.
func TestDPoPPushedAuthorizationClientKey(t *testing.T) {
	envKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	storedKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ek, _ := clientkey.FromSigner(envKey)
	sk, _ := clientkey.FromSigner(storedKey)
	pub, _ := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{ek.PublicJWK(), sk.PublicJWK()}})
	w := newSenderWorld(t, 0, "pkjwt", []string{"CLIENT_JWKS=" + string(pub), "PAR_REQUIRED=1"})
	tg := w.newStack(t, tokenguard.WithClientKey(envKey), tokenguard.WithDPoP(), tokenguard.WithRevocationURL(w.d.Revocation))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	t.Run("OAUTH_* provider, aud the token endpoint", func(t *testing.T) {
		authURL, err := w.connectVia(t, tg, tokenguard.ConnectFlow{Connection: "par-env"})
		if err != nil {
			t.Fatalf("connect through PAR: %v", err)
		}
		w.checkPushed(t, tg, authURL, "par-env", w.d.Token)
	})

	t.Run("stored provider, aud the issuer", func(t *testing.T) {
		der, _ := x509.MarshalPKCS8PrivateKey(storedKey)
		p := domain.Provider{Name: "pkjwt-stored", TokenURL: w.d.Token, AuthURL: w.d.Authorization, RevocationURL: w.d.Revocation,
			ClientID: "pkjwt", AuthStyle: domain.AuthStylePrivateKeyJWT, Scopes: w.cfg.Scopes, Profile: "auth0", DPoP: true,
			PAR: domain.PARAlways, ClientKey: domain.NewSecret(string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})))}
		if _, err := repository.NewProviderRepository(w.openDB(t), tokencrypt.Plaintext{}).Add(ctx, p); err != nil {
			t.Fatal(err)
		}
		authURL, err := w.connectVia(t, tg, tokenguard.ConnectFlow{Connection: "par-stored", Provider: p.Name})
		if err != nil {
			t.Fatalf("connect through PAR: %v", err)
		}
		issuer := strings.TrimSuffix(w.n.issuer, "/")
		w.checkPushed(t, tg, authURL, "par-stored", issuer)
		var set jose.JSONWebKeySet
		if err := json.Unmarshal(tg.ClientJWKS(), &set); err != nil || len(set.Keys) != 2 ||
			!slices.ContainsFunc(set.Keys, func(k jose.JSONWebKey) bool { return k.KeyID == sk.KID() && k.IsPublic() }) {
			t.Errorf("JWKS without the stored provider's key: %s", tg.ClientJWKS())
		}
	})

	t.Run("an unredeemed result's grant is revoked with a proof", func(t *testing.T) {
		authURL, f, err := tg.AuthCodeURL(ctx, tokenguard.ConnectFlow{Connection: "par-unredeemed"})
		if err != nil {
			t.Fatal(err)
		}
		q, err := browserCallback(ctx, authURL, redirectURI, loginAndConsent)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tg.Complete(ctx, f, q); err != nil {
			t.Fatal(err)
		}
		if err := w.openDB(t).Exec("UPDATE tokenguard_connect_results SET expires_at = now() WHERE connection = 'par-unredeemed'").Error; err != nil {
			t.Fatal(err)
		}
		before := w.events(func(ev map[string]any) bool { return ev["event"] == "revocation" && ev["dpop"] == true })
		if n, err := tg.SweepConnectResults(ctx); err != nil || n != 1 {
			t.Fatalf("sweep: %d %v", n, err)
		}
		if after := w.eventsUpTo(before+1, func(ev map[string]any) bool {
			return ev["event"] == "revocation" && ev["dpop"] == true && ev["status"] == float64(200)
		}); after != before+1 {
			t.Errorf("revocations with a proof: %d -> %d, want one more", before, after)
		}
	})

	t.Run("control: not pushed, refused", func(t *testing.T) {
		plain := w.newStack(t, tokenguard.WithClientKey(envKey), tokenguard.WithDPoP(), tokenguard.WithPAR(tokenguard.PARNever))
		before := w.events(func(ev map[string]any) bool { return ev["event"] == "authorization.error" })
		authURL, err := w.connectVia(t, plain, tokenguard.ConnectFlow{Connection: "par-control"})
		if err == nil || !strings.Contains(err.Error(), "invalid_request") {
			t.Fatalf("authorization request not pushed to a server that requires PAR: %v, want invalid_request", err)
		}
		if q := mustQuery(t, authURL); q.Get("request_uri") != "" || q.Get("code_challenge") == "" {
			t.Errorf("PAR never still pushed: %v", q)
		}
		if after := w.eventsUpTo(before+1, func(ev map[string]any) bool { return ev["event"] == "authorization.error" }); after != before+1 {
			t.Errorf("authorization errors at the server: %d -> %d", before, after)
		}
	})
}

// checkPushed checks what the server saw of connection's flow through
// PAR, with assertions for aud, and that its DPoP-bound grant refreshes
// and is revoked with a proof.
func (w *dpopWorld) checkPushed(t *testing.T, tg *tokenguard.Tokens, authURL, connection, aud string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	q := mustQuery(t, authURL)
	if len(q) != 2 || q.Get("client_id") != "pkjwt" || !strings.HasPrefix(q.Get("request_uri"), "urn:ietf:params:oauth:request_uri:") {
		t.Errorf("the browser's authorization URL carries %v, want only client_id and request_uri", q)
	}
	stored, err := tg.Repository().Get(ctx, connection)
	if err != nil || stored.DPoPJKT == "" {
		t.Fatalf("stored grant: %v, binding %q", err, stored.DPoPJKT)
	}
	pushed := w.eventsUpTo(1, func(ev map[string]any) bool {
		return ev["event"] == "par.success" && ev["dpop_jkt"] == stored.DPoPJKT && ev["code_challenge_method"] == "S256" && ev["assertion_aud"] == aud
	})
	if pushed != 1 {
		w.events(func(ev map[string]any) bool { t.Logf("event %v", ev); return false })
	}
	if pushed != 1 {
		t.Errorf("pushed requests naming the grant's key, S256 and aud %s: %d, want 1", aud, pushed)
	}
	if _, err := tg.ForceRefresh(ctx, connection, stored.Version); err != nil {
		t.Fatalf("refresh of the pushed flow's grant: %v", err)
	}
	bound := w.eventsUpTo(2, func(ev map[string]any) bool {
		return ev["event"] == "grant.success" && ev["assertion_aud"] == aud && strings.EqualFold(ev["token_type"].(string), "DPoP")
	})
	if bound < 2 {
		t.Errorf("DPoP-bound grants with aud %s (the code exchange and the refresh): %d, want 2", aud, bound)
	}
	if err := tg.Disconnect(ctx, connection, true); err != nil {
		t.Fatalf("disconnect with revocation: %v", err)
	}
	revoked := w.eventsUpTo(1, func(ev map[string]any) bool {
		return ev["event"] == "revocation" && ev["status"] == float64(200) && ev["dpop"] == true && ev["assertion_aud"] == aud
	})
	if revoked != 1 {
		t.Errorf("revocations with a DPoP proof and aud %s: %d, want 1", aud, revoked)
	}
}

func mustQuery(t *testing.T, u string) url.Values {
	t.Helper()
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	return p.Query()
}

// loginAndConsent fills oidc-provider's login and consent pages.
func loginAndConsent(_ string, form url.Values) bool {
	switch form.Get("prompt") {
	case "login":
		form.Set("login", "conformance-user")
		form.Set("password", "any")
		return true
	case "consent":
		return true
	}
	return false
}
