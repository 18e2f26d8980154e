package conformance_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/tokenguard/tokenguard"
	"github.com/tokenguard/tokenguard/infra/clientkey"
	"github.com/tokenguard/tokenguard/infra/httpapi"
	"github.com/tokenguard/tokenguard/internal/waitfor"
)

// newKeyWorld is oidc-provider with client pkjwt registered for
// private_key_jwt with a key of its own, and one stack signing with it.
func newKeyWorld(t *testing.T) (*dpopWorld, *ecdsa.PrivateKey, *clientkey.Key) {
	priv, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	k, err := clientkey.FromSigner(priv)
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{k.PublicJWK()}})
	return newSenderWorld(t, 1, "pkjwt", []string{"CLIENT_JWKS=" + string(pub)}, tokenguard.WithClientKey(priv)), priv, k
}

// TestPrivateKeyJWT: oidc-provider's client registered for
// private_key_jwt (its public key in the registration) is connected and
// refreshed by tokenguard with an assertion per token request, and
// GET /.well-known/jwks.json serves the key's public half under its
// thumbprint. Control: a stack signing with another key is refused as a
// client (ErrClientRejected) and the grant is untouched.
func TestPrivateKeyJWT(t *testing.T) {
	w, _, k := newKeyWorld(t)
	tg := w.stacks[0]
	w.connect(t, tg, "pk-conn")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stored, err := tg.Repository().Get(ctx, "pk-conn")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tg.ForceRefresh(ctx, "pk-conn", stored.Version); err != nil {
		t.Fatalf("refresh with an assertion: %v", err)
	}
	ok := w.eventsUpTo(2, func(ev map[string]any) bool { return ev["event"] == "grant.success" && ev["client_id"] == "pkjwt" })
	if ok != 2 {
		t.Errorf("grants to pkjwt at the server: %d, want 2 (the code exchange and the refresh)", ok)
	}

	// Another key: refused as a client, the grant untouched.
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	db := w.openDB(t)
	wrong, err := tokenguard.New(db, w.cfg, tokenguard.WithClientKey(other), tokenguard.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	cur, _ := tg.Repository().Get(ctx, "pk-conn")
	if _, err := wrong.ForceRefresh(ctx, "pk-conn", cur.Version); !errors.Is(err, tokenguard.ErrClientRejected) {
		t.Errorf("refresh signed with another key: %v, want ErrClientRejected", err)
	}
	if after, _ := tg.Repository().Get(ctx, "pk-conn"); after.Version != cur.Version || after.Status != "active" {
		t.Errorf("the refused client changed the grant: version %d -> %d, status %s", cur.Version, after.Version, after.Status)
	}
	// The next refresh with the right key (when the token is due) works.
	waitfor.Until(t, 10*time.Second, "a refresh with the right key after the refused one", func() bool {
		c, err := tg.Credential(ctx, "pk-conn")
		return err == nil && c.Version > cur.Version
	})

	srv := httptest.NewUnstartedServer(nil)
	srv.Config.Handler = httpapi.New(httpapi.Deps{Tokens: tg, Keys: dpopKeys{}, Log: slog.New(slog.DiscardHandler),
		Edges: httpapi.Edges{Hosts: []string{srv.Listener.Addr().String()}, ProxyMaxBody: 1 << 20, Rate: 1e6, Burst: 1e6}}).Handler()
	srv.Start()
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/.well-known/jwks.json")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var set jose.JSONWebKeySet
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &set) != nil || len(set.Keys) != 1 || set.Keys[0].KeyID != k.KID() || !set.Keys[0].IsPublic() {
		t.Errorf("jwks: %d %s", resp.StatusCode, body)
	}
}
