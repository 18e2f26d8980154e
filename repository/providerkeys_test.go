package repository_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/repository"
)

const clientKeyPEM = "-----BEGIN PRIVATE KEY-----\nnot-checked-here\n-----END PRIVATE KEY-----\n"

// A stored provider's client key (private_key_jwt) is sealed like its
// client secret, bound to its row and column: it does not open as the
// secret, nor in another row; rotate-key reseals it. Its resource and PAR
// mode round-trip; a row written before them reads as none and auto.
func TestProviderClientKeySealed(t *testing.T) {
	_, db, _ := newRepo(t)
	ctx := context.Background()
	repo := repository.NewProviderRepository(db, keyring(t, "k1="+testKey1))
	p := acmeProvider()
	p.AuthStyle, p.ClientSecret, p.ClientKey = domain.AuthStylePrivateKeyJWT, domain.Secret{}, domain.NewSecret(clientKeyPEM)
	p.Resource, p.PAR = "https://api.example/", domain.PARAlways
	added, err := repo.Add(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if added.ClientKey.Reveal() != clientKeyPEM || added.Resource != p.Resource || added.PAR != domain.PARAlways || added.AuthStyle != domain.AuthStylePrivateKeyJWT {
		t.Fatalf("added: %+v", added)
	}
	var raw string
	if err := db.Raw("SELECT client_key FROM tokenguard_providers WHERE name = 'acme-idp'").Scan(&raw).Error; err != nil || strings.Contains(raw, "PRIVATE KEY") {
		t.Fatalf("client_key at rest: %v %q", err, raw)
	}
	// Not a client secret: swapped into that column, it does not open.
	if err := db.Exec("UPDATE tokenguard_providers SET client_secret = client_key WHERE name = 'acme-idp'").Error; err != nil {
		t.Fatal(err)
	}
	if _, err := repo.Get(ctx, "acme-idp"); !errors.Is(err, domain.ErrUndecryptable) {
		t.Fatalf("the key opened as a client secret: %v", err)
	}
	if _, err := repo.Update(ctx, "nothing", func(*domain.Provider) error { return nil }); !errors.Is(err, domain.ErrUnknownProvider) {
		t.Fatal(err)
	}

	// Resealed by rotate-key; a row of an older release reads as none/auto.
	if _, err := repo.Add(ctx, domain.Provider{Name: "k", TokenURL: "https://k.example/token", ClientID: "c",
		AuthStyle: domain.AuthStylePrivateKeyJWT, ClientKey: domain.NewSecret(clientKeyPEM)}); err != nil {
		t.Fatal(err)
	}
	if _, err := repo.Add(ctx, domain.Provider{Name: "old", TokenURL: "https://o.example/token", ClientID: "c", ClientSecret: domain.NewSecret("x")}); err != nil {
		t.Fatal(err)
	}
	k2 := repository.NewProviderRepository(db, keyring(t, "k2="+testKey2+"*,k1="+testKey1))
	if err := db.Exec("DELETE FROM tokenguard_providers WHERE name = 'acme-idp'").Error; err != nil {
		t.Fatal(err)
	}
	if _, _, err := k2.Reseal(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := repository.NewProviderRepository(db, keyring(t, "k2="+testKey2)).Get(ctx, "k")
	if err != nil || got.ClientKey.Reveal() != clientKeyPEM {
		t.Fatalf("after reseal, with k2 alone: %v", err)
	}
	old, err := k2.Get(ctx, "old")
	if err != nil || old.Resource != "" || old.PAR != "" || !old.ClientKey.IsZero() {
		t.Fatalf("a provider without the new settings: %v %+v", err, old)
	}
}
