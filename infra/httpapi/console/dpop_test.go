package console

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"math/big"
	"strings"
	"testing"
	"time"

	"golang.org/x/oauth2"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/tokenguard/tokenguard"
	"github.com/tokenguard/tokenguard/infra/dpop"
	"github.com/tokenguard/tokenguard/internal/testdb"
)

// A DPoP-bound grant imported with its key, read from the real store:
// the connection page shows the binding as dpop with the key's
// thumbprint; no page shows the key (its PEM, its private scalar in any
// encoding). A bearer grant's binding says bearer.
func TestPagesShowTheDPoPBindingNeverTheKey(t *testing.T) {
	db, err := gorm.Open(postgres.Open(testdb.New(t)), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	sqlDB, _ := db.DB()
	t.Cleanup(func() { _ = sqlDB.Close() })
	tg, err := tokenguard.New(db, &oauth2.Config{ClientID: "c", Endpoint: oauth2.Endpoint{TokenURL: "http://127.0.0.1:1/token"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tg.Close(context.Background()) })
	ctx := context.Background()
	priv, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	key, _ := dpop.FromSigner(priv)
	tok := &oauth2.Token{AccessToken: "at-bound", RefreshToken: "rt-bound", TokenType: "DPoP", Expiry: time.Now().Add(time.Hour)}
	if err := tg.Import(ctx, "acme", tok, tokenguard.WithDPoPKey(priv)); err != nil {
		t.Fatal(err)
	}
	bearer := &oauth2.Token{AccessToken: "at-bearer", RefreshToken: "rt-bearer", Expiry: time.Now().Add(time.Hour)}
	if err := tg.Import(ctx, "initech", bearer); err != nil {
		t.Fatal(err)
	}

	store, sessions := &fakeStore{}, fakeSessions{}
	c := New(Deps{Keys: fakeKeys{}, Sessions: sessions, Connections: tg.Repository(), History: store, Actions: store, Links: store, Providers: store.Providers})
	session, _, _ := sessions.Create(ctx, 7, time.Hour)
	get := func(target string) string {
		w := do(c, "GET", target, session.Reveal(), nil)
		checkPage(t, target, w)
		return w.Body.String()
	}
	page := get("/console/connections/acme")
	if !strings.Contains(page, "dpop, key thumbprint <code>"+key.Thumbprint()+"</code>") {
		t.Errorf("the bound connection's page does not show its binding as dpop with the thumbprint %s:\n%s", key.Thumbprint(), page)
	}
	if !strings.Contains(get("/console/connections/initech"), `<span class="muted">bearer</span>`) {
		t.Error("the bearer connection's page does not say bearer")
	}

	d, err := priv.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	pemBody := strings.Split(string(key.MarshalPEM()), "\n")[1]
	secrets := map[string]string{"PEM": pemBody[:24], "d (base64url)": base64.RawURLEncoding.EncodeToString(d),
		"d (base64)": base64.StdEncoding.EncodeToString(d), "d (hex)": hex.EncodeToString(d), "d (decimal)": new(big.Int).SetBytes(d).String()}
	for _, target := range []string{"/console/connections/acme", "/console/connections"} {
		body := get(target)
		for what, s := range secrets {
			if strings.Contains(body, s) {
				t.Errorf("%s shows the DPoP key (%s)", target, what)
			}
		}
	}
}
