package repository_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/internal/waitfor"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

const providerSecret = "s3cr3t-client-secret-value"

func acmeProvider() domain.Provider {
	return domain.Provider{Name: "acme-idp", TokenURL: "https://idp.example/token", ClientID: "client-1",
		ClientSecret: domain.NewSecret(providerSecret), AuthStyle: domain.AuthStyleHeader, Scopes: []string{"a", "b"},
		Skew: 5 * time.Second, KeepAlive: 720 * time.Hour}
}

// The client secret is sealed in its column, opens again with the same
// keyring, never shows in an error, and updates keep what they do not
// change.
func TestProviderCRUDSealsTheSecret(t *testing.T) {
	_, db, _ := newRepo(t)
	ctx := context.Background()
	k := keyring(t, "k1="+testKey1)
	repo := repository.NewProviderRepository(db, k)

	added, err := repo.Add(ctx, acmeProvider())
	if err != nil {
		t.Fatal(err)
	}
	if added.Version != 1 || !added.ClientSecret.Equal(domain.NewSecret(providerSecret)) || added.Skew != 5*time.Second ||
		added.DefaultLifetime != 0 || strings.Join(added.Scopes, ",") != "a,b" || added.AuthStyle != domain.AuthStyleHeader {
		t.Fatalf("added %+v", added)
	}
	var raw string
	if err := db.Raw("SELECT client_secret FROM tokenguard_providers WHERE name = 'acme-idp'").Scan(&raw).Error; err != nil {
		t.Fatal(err)
	}
	if raw == "" || strings.Contains(raw, providerSecret) || !k.IsCurrent(raw) {
		t.Fatalf("stored client secret is not an envelope of the current key: %q", raw)
	}
	// Bound to its row: another provider's column cannot be swapped in.
	if _, err := repo.Add(ctx, domain.Provider{Name: "other", TokenURL: "https://o.example/token", ClientID: "c", ClientSecret: domain.NewSecret("x")}); err != nil {
		t.Fatal(err)
	}
	if err := db.Exec("UPDATE tokenguard_providers SET client_secret = ? WHERE name = 'other'", raw).Error; err != nil {
		t.Fatal(err)
	}
	if _, err := repo.Get(ctx, "other"); !errors.Is(err, domain.ErrUndecryptable) {
		t.Errorf("a secret moved to another row: %v, want ErrUndecryptable", err)
	}
	if _, err := repository.NewProviderRepository(db, tokencrypt.Plaintext{}).Get(ctx, "acme-idp"); !errors.Is(err, domain.ErrUndecryptable) {
		t.Errorf("read without keys: %v, want ErrUndecryptable", err)
	}
	if err := db.Exec("DELETE FROM tokenguard_providers WHERE name = 'other'").Error; err != nil {
		t.Fatal(err)
	}

	var errs []error
	_, err = repo.Add(ctx, acmeProvider())
	if !errors.Is(err, domain.ErrProviderExists) {
		t.Errorf("second add: %v, want ErrProviderExists", err)
	}
	errs = append(errs, err)
	bad := acmeProvider()
	bad.Name, bad.TokenURL = "bad", "ftp://"+providerSecret
	_, err = repo.Add(ctx, bad)
	if !errors.Is(err, domain.ErrInvalidProvider) {
		t.Errorf("bad URL: %v, want ErrInvalidProvider", err)
	}
	bad.TokenURL = "https://x.example/token"
	bad.AuthStyle = domain.AuthStyle(providerSecret)
	_, err = repo.Add(ctx, bad)
	if !errors.Is(err, domain.ErrInvalidProvider) {
		t.Errorf("bad auth style: %v, want ErrInvalidProvider", err)
	}

	updated, err := repo.Update(ctx, "acme-idp", func(p *domain.Provider) error {
		p.ClientSecret = domain.NewSecret("rotated-secret")
		p.Skew = 0
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if updated.Version != 2 || !updated.ClientSecret.Equal(domain.NewSecret("rotated-secret")) || updated.Skew != 0 ||
		updated.ClientID != "client-1" || updated.KeepAlive != 720*time.Hour {
		t.Errorf("updated %+v", updated)
	}
	_, err = repo.Update(ctx, "nobody", func(*domain.Provider) error { return nil })
	if !errors.Is(err, domain.ErrUnknownProvider) {
		t.Errorf("update of an unknown provider: %v", err)
	}
	errs = append(errs, err)
	list, err := repo.List(ctx)
	if err != nil || len(list) != 1 || list[0].Name != "acme-idp" {
		t.Fatalf("list: %v %v", list, err)
	}
	for _, s := range []string{fmt.Sprint(list), fmt.Sprintf("%+v", list[0]), fmt.Sprintf("%#v", list[0])} {
		if strings.Contains(s, "rotated-secret") {
			t.Errorf("printed provider shows its secret: %s", s)
		}
	}
	for _, err := range errs {
		if err != nil && strings.Contains(err.Error(), providerSecret) {
			t.Errorf("error shows the secret: %v", err)
		}
	}
	if err := repo.Remove(ctx, "acme-idp"); err != nil {
		t.Fatal(err)
	}
	if err := repo.Remove(ctx, "acme-idp"); !errors.Is(err, domain.ErrUnknownProvider) {
		t.Errorf("second remove: %v, want ErrUnknownProvider", err)
	}
}

// Put sets a connection's provider, Save never changes it, an unknown
// provider stores nothing, and a provider in use cannot be removed.
func TestTokenProvider(t *testing.T) {
	r, db, _ := newRepo(t)
	ctx := context.Background()
	providers := repository.NewProviderRepository(db, tokencrypt.Plaintext{})
	if _, err := providers.Add(ctx, acmeProvider()); err != nil {
		t.Fatal(err)
	}

	// A row written by a process that knows no providers reads as the
	// environment's provider.
	old := put(t, r, grantToken("legacy", "at0", "rt0"))
	if old.Provider != "" {
		t.Fatalf("legacy row provider %q", old.Provider)
	}

	tok := grantToken("acme", "at1", "rt1")
	tok.Provider = "acme-idp"
	stored := put(t, r, tok)
	if stored.Provider != "acme-idp" {
		t.Fatalf("put: provider %q", stored.Provider)
	}
	next := stored.Rotated(domain.Grant{AccessToken: domain.NewSecret("at2"), RefreshToken: domain.NewSecret("rt2")}, time.Now())
	next.Provider = "" // Store must not care
	saved, err := r.Store(ctx, next)
	if err == nil && saved.Provider != "acme-idp" {
		err = fmt.Errorf("saved provider %q", saved.Provider)
	}
	if err != nil {
		t.Fatal(err)
	}
	if got, err := r.Get(ctx, "acme"); err != nil || got.Provider != "acme-idp" {
		t.Fatalf("after save: %q %v", got.Provider, err)
	}

	// An unknown provider: typed error, nothing stored.
	if err := r.Register(ctx, "ghost"); err != nil {
		t.Fatal(err)
	}
	ghost := grantToken("ghost", "at", "rt")
	ghost.Provider = "nobody"
	err = r.InLock(ctx, "ghost", time.Second, time.Second, func(ctx context.Context, l usecase.LockedStore) error {
		_, err := l.Put(ctx, ghost)
		return err
	})
	if !errors.Is(err, domain.ErrUnknownProvider) {
		t.Fatalf("put with an unknown provider: %v", err)
	}
	if _, err := r.Get(ctx, "ghost"); !errors.Is(err, domain.ErrNotFound) {
		t.Errorf("after a refused put: %v, want ErrNotFound", err)
	}

	if err := providers.Remove(ctx, "acme-idp"); !errors.Is(err, domain.ErrProviderInUse) {
		t.Fatalf("remove in use: %v, want ErrProviderInUse", err)
	}
	if n, err := providers.Connections(ctx); err != nil || n["acme-idp"] != 1 {
		t.Errorf("connections %v %v", n, err)
	}
	// A new grant from the environment's provider frees it.
	put(t, r, grantToken("acme", "at3", "rt3"))
	if err := providers.Remove(ctx, "acme-idp"); err != nil {
		t.Errorf("remove unused: %v", err)
	}
}

type nopTarget struct{}

func (nopTarget) Invalidate(string, int64) {}
func (nopTarget) TrustCache(bool)          {}

// Every committed provider change reaches the change listener's provider
// handler with the provider's name; a connection tells "" first.
func TestProviderChangesAreAnnounced(t *testing.T) {
	_, db, url := newRepo(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var heard []string
	l := repository.NewChangeListener(url, nopTarget{}, nil).OnProviderChange(func(name string) {
		mu.Lock()
		heard = append(heard, name)
		mu.Unlock()
	})
	done := make(chan struct{})
	go func() { defer close(done); _ = l.Run(ctx) }()
	got := func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), heard...) }
	waitfor.Until(t, 5*time.Second, "no backlog call after LISTEN", func() bool { return len(got()) > 0 })
	if g := got(); g[0] != "" {
		t.Fatalf("first call %q, want \"\"", g[0])
	}
	repo := repository.NewProviderRepository(db, tokencrypt.Plaintext{})
	if _, err := repo.Add(ctx, acmeProvider()); err != nil {
		t.Fatal(err)
	}
	if _, err := repo.Update(ctx, "acme-idp", func(p *domain.Provider) error { p.ClientSecret = domain.NewSecret("x"); return nil }); err != nil {
		t.Fatal(err)
	}
	if err := repo.Remove(ctx, "acme-idp"); err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, 5*time.Second, fmt.Sprintf("heard %q, want 3 changes", got()), func() bool { return len(got()) >= 4 })
	if g := got(); strings.Join(g[1:], ",") != "acme-idp,acme-idp,acme-idp" {
		t.Errorf("heard %q", g)
	}
	for _, name := range got() {
		if strings.Contains(name, providerSecret) {
			t.Errorf("notification carries the secret")
		}
	}
	cancel()
	<-done
}

// rotate-key reseals the providers' client secrets with the current key.
func TestResealProviders(t *testing.T) {
	_, db, _ := newRepo(t)
	ctx := context.Background()
	if _, err := repository.NewProviderRepository(db, keyring(t, "k1="+testKey1)).Add(ctx, acmeProvider()); err != nil {
		t.Fatal(err)
	}
	k2 := keyring(t, "k2="+testKey2+"*,k1="+testKey1)
	repo := repository.NewProviderRepository(db, k2)
	resealed, current, err := repo.Reseal(ctx)
	if err != nil || resealed != 1 || current != 0 {
		t.Fatalf("reseal: %d %d %v", resealed, current, err)
	}
	p, err := repository.NewProviderRepository(db, keyring(t, "k2="+testKey2)).Get(ctx, "acme-idp")
	if err != nil || !p.ClientSecret.Equal(domain.NewSecret(providerSecret)) || p.Version != 1 {
		t.Fatalf("after reseal, with k2 alone: %v (version %d)", err, p.Version)
	}
	if resealed, current, err = repo.Reseal(ctx); err != nil || resealed != 0 || current != 1 {
		t.Errorf("second reseal: %d %d %v", resealed, current, err)
	}
}
