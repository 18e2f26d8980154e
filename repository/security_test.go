package repository_test

import (
	"context"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

func TestAPIKeysStoredHashedVerifiedAndRevoked(t *testing.T) {
	_, db, _ := newRepo(t)
	ctx := context.Background()
	keys := repository.NewAPIKeys(db)
	key, err := keys.Create(ctx, "ci", domain.KeyAccess{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(key.Reveal(), "tgk_") || len(key.Reveal()) != 4+43 {
		t.Fatalf("key shape: %d chars", len(key.Reveal()))
	}
	if _, err := keys.Create(ctx, "ci", domain.KeyAccess{}); !errors.Is(err, domain.ErrKeyExists) {
		t.Errorf("second key named ci: %v", err)
	}
	// Only the hash is stored.
	var stored string
	db.Raw("SELECT encode(key_hash, 'hex') FROM tokenguard_api_keys WHERE name = 'ci'").Scan(&stored)
	if stored != hex.EncodeToString(repository.HashKey(key)) {
		t.Errorf("stored %s", stored)
	}
	cache := repository.NewKeyCache(keys, 300*time.Millisecond)
	if a, err := cache.Verify(ctx, key); err != nil || a.Name != "ci" || a.Scopes != nil || a.Connections != nil {
		t.Fatalf("Verify = %+v, %v (want ci with every right)", a, err)
	}
	if _, err := cache.Verify(ctx, domain.NewSecret(key.Reveal()+"x")); !errors.Is(err, domain.ErrUnauthorized) {
		t.Errorf("a wrong key: %v", err)
	}
	// A key created after the cache loaded works at once.
	scoped := domain.KeyAccess{Scopes: []domain.Scope{domain.ScopeTokenRead, domain.ScopeConnect}, Connections: []string{"tenant-a-*", "solo"}}
	late, err := keys.Create(ctx, "late", scoped)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(250 * time.Millisecond) // past the reload floor
	if a, err := cache.Verify(ctx, late); err != nil || a.Name != "late" || !slices.Equal(a.Scopes, scoped.Scopes) || !slices.Equal(a.Connections, scoped.Connections) {
		t.Errorf("new scoped key: %+v, %v", a, err)
	}
	for _, bad := range []domain.KeyAccess{{Scopes: []domain.Scope{"root"}}, {Scopes: []domain.Scope{}}, {Connections: []string{"a,b"}}, {Connections: []string{"[x"}}} {
		if _, err := keys.Create(ctx, "bad", bad); !errors.Is(err, domain.ErrInvalidKeyAccess) {
			t.Errorf("Create with %+v: %v, want ErrInvalidKeyAccess", bad, err)
		}
	}
	if err := keys.Revoke(ctx, "ci"); err != nil {
		t.Fatal(err)
	}
	if err := keys.Revoke(ctx, "ci"); !errors.Is(err, domain.ErrNotFound) {
		t.Errorf("revoke twice: %v", err)
	}
	time.Sleep(350 * time.Millisecond) // the cache's TTL
	if _, err := cache.Verify(ctx, key); !errors.Is(err, domain.ErrUnauthorized) {
		t.Errorf("revoked key: %v", err)
	}
	list, err := keys.List(ctx)
	if err != nil || len(list) != 1 || list[0].Name != "late" || list[0].LastUsedAt == nil || !slices.Equal(list[0].Connections, scoped.Connections) {
		t.Errorf("List = %+v, %v (want late, last used set)", list, err)
	}
}

func TestConnectSessionSingleUseAndExpiring(t *testing.T) {
	_, db, _ := newRepo(t)
	ctx := context.Background()
	s := repository.NewConnectSessions(db)
	tok, exp, err := s.Create(ctx, domain.ConnectSession{Connection: "acme", ReturnTo: "https://app/x", CreatedBy: "ci"})
	if err != nil || !strings.HasPrefix(tok.Reveal(), "tgs_") || time.Until(exp) < 9*time.Minute || time.Until(exp) > 11*time.Minute {
		t.Fatalf("Create: %v, expires in %v", err, time.Until(exp))
	}
	flow := domain.NewCredential(domain.FlowPrefix)
	if peeked, err := s.Peek(ctx, tok); err != nil || peeked.Connection != "acme" || peeked.CreatedBy != "ci" {
		t.Fatalf("Peek = %+v, %v", peeked, err)
	}
	got, err := s.Open(ctx, tok, flow, "st", "ver")
	if err != nil || got.Connection != "acme" || got.ReturnTo != "https://app/x" {
		t.Fatalf("Open = %+v, %v", got, err)
	}
	if _, err := s.Open(ctx, tok, domain.NewCredential(domain.FlowPrefix), "st2", "ver2"); !errors.Is(err, domain.ErrUnauthorized) {
		t.Errorf("replayed session: %v", err)
	}
	if _, err := s.Peek(ctx, tok); !errors.Is(err, domain.ErrUnauthorized) {
		t.Errorf("Peek of an opened session: %v", err)
	}
	// Another state spends nothing: the flow's own answer still finishes it.
	for _, state := range []string{"", "forged"} {
		if _, err := s.Finish(ctx, flow, state); !errors.Is(err, domain.ErrUnauthorized) {
			t.Errorf("Finish with state %q: %v", state, err)
		}
	}
	done, err := s.Finish(ctx, flow, "st")
	if err != nil || done.State != "st" || done.Verifier != "ver" || done.Connection != "acme" {
		t.Fatalf("Finish = %+v, %v", done, err)
	}
	if _, err := s.Finish(ctx, flow, "st"); !errors.Is(err, domain.ErrUnauthorized) {
		t.Errorf("replayed callback: %v", err)
	}
	var verifiers int
	db.Raw("SELECT count(*) FROM tokenguard_connect_sessions WHERE pkce_verifier <> '' OR oauth_state <> ''").Scan(&verifiers)
	if verifiers != 0 {
		t.Errorf("%d finished flows keep their state or verifier", verifiers)
	}
	// Expired.
	old, _, err := s.Create(ctx, domain.ConnectSession{Connection: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	db.Exec("UPDATE tokenguard_connect_sessions SET expires_at = now() - interval '1 second' WHERE token_hash = decode(?, 'hex')", hex.EncodeToString(repository.HashKey(old)))
	if _, err := s.Open(ctx, old, domain.NewCredential(domain.FlowPrefix), "s", "v"); !errors.Is(err, domain.ErrUnauthorized) {
		t.Errorf("expired session: %v", err)
	}
	// Only hashes are stored.
	var n int
	db.Raw("SELECT count(*) FROM tokenguard_connect_sessions WHERE token_hash = decode(?, 'hex')", hex.EncodeToString(repository.HashKey(tok))).Scan(&n)
	if n != 1 {
		t.Errorf("%d sessions stored under the token's hash", n)
	}
}

func TestGrantFromAnotherAccountRefusedAndNothingStored(t *testing.T) {
	repo, db, _ := newRepo(t)
	ctx := context.Background()
	uc := usecase.NewConnectUseCase(repo, nil, time.Second)
	grant := func(at, rt string) domain.Grant {
		return domain.Grant{AccessToken: domain.NewSecret(at), RefreshToken: domain.NewSecret(rt), Expiry: time.Now().Add(time.Hour)}
	}
	first, err := uc.ConnectGrant(ctx, "acme", grant("at-owner", "rt-owner"), usecase.ConnectRequest{Binding: domain.Binding{Account: "owner", Scopes: "api"}})
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		AccessToken, RefreshToken string
		Version                   int64
		UpdatedAt                 time.Time
		GrantedAccount            string
	}
	read := func() row {
		var r row
		db.Raw("SELECT access_token, refresh_token, version, updated_at, granted_account FROM tokenguard_tokens").Scan(&r)
		return r
	}
	before := read()
	_, err = uc.ConnectGrant(ctx, "acme", grant("at-attacker", "rt-attacker"), usecase.ConnectRequest{Binding: domain.Binding{Account: "attacker"}})
	if !errors.Is(err, domain.ErrAccountMismatch) {
		t.Fatalf("attacker's grant: %v", err)
	}
	if after := read(); after != before {
		t.Errorf("stored row changed: %+v -> %+v", before, after)
	}
	// The owner connecting again is fine; an allowed change too.
	if _, err := uc.ConnectGrant(ctx, "acme", grant("at-2", "rt-2"), usecase.ConnectRequest{Binding: domain.Binding{Account: "owner"}}); err != nil {
		t.Errorf("same account again: %v", err)
	}
	moved, err := uc.ConnectGrant(ctx, "acme", grant("at-3", "rt-3"), usecase.ConnectRequest{Binding: domain.Binding{Account: "new-owner", Scopes: "read", MissingScopes: "api"}, AllowAccountChange: true})
	if err != nil || moved.Binding.Account != "new-owner" || moved.Version != first.Version+2 ||
		moved.Binding.MissingScopes != "api" || moved.Binding.Scopes != "read" {
		t.Errorf("allowed account change: %+v, %v", moved.Binding, err)
	}

	// Every grant and status change left one outbox event, in order.
	var types []string
	db.Raw("SELECT type FROM tokenguard_webhook_outbox ORDER BY id").Scan(&types)
	if strings.Join(types, ",") != "connection.connected,connection.connected,connection.connected" {
		t.Errorf("outbox after three grants: %v", types)
	}
	db.Exec("DELETE FROM tokenguard_webhook_outbox")
	cur, _ := repo.Get(ctx, "acme")
	dead := cur
	dead.Status, dead.StatusReason = domain.StatusNeedsReauth, "invalid_grant"
	if _, err := repo.Store(ctx, dead); err != nil {
		t.Fatal(err)
	}
	if _, err := uc.ConnectGrant(ctx, "acme", grant("at-4", "rt-4"), usecase.ConnectRequest{Binding: domain.Binding{Account: "new-owner"}}); err != nil {
		t.Fatal(err)
	}
	// A refresh (Store on an active token) is no event.
	cur, _ = repo.Get(ctx, "acme")
	if _, err := repo.Store(ctx, cur.Rotated(grant("at-5", "rt-5"), time.Now())); err != nil {
		t.Fatal(err)
	}
	var events []struct {
		Type, Connection string
		Data             string
	}
	db.Raw("SELECT type, connection, data::text AS data FROM tokenguard_webhook_outbox ORDER BY id").Scan(&events)
	if len(events) != 2 || events[0].Type != "connection.needs_reauth" || !strings.Contains(events[0].Data, `"reason": "invalid_grant"`) ||
		events[1].Type != "connection.recovered" || events[1].Connection != "acme" || !strings.Contains(events[1].Data, `"account": "new-owner"`) {
		t.Errorf("outbox: %+v", events)
	}
	for _, e := range events {
		if strings.Contains(e.Data, "at-") || strings.Contains(e.Data, "rt-") {
			t.Errorf("an event carries a token: %s", e.Data)
		}
	}
}

// TestAccountBindingIncludesProvider: the same account id at another
// provider is another account: a grant of it is refused unless the session
// allows the change. Control: the same id at the same provider is the
// owner connecting again.
func TestAccountBindingIncludesProvider(t *testing.T) {
	repo, db, _ := newRepo(t)
	ctx := context.Background()
	if _, err := repository.NewProviderRepository(db, tokencrypt.Plaintext{}).Add(ctx,
		domain.Provider{Name: "other", TokenURL: "https://other.example/token", ClientID: "c", AuthStyle: domain.AuthStyleAuto}); err != nil {
		t.Fatal(err)
	}
	uc := usecase.NewConnectUseCase(repo, nil, time.Second)
	grant := func(at string) domain.Grant {
		return domain.Grant{AccessToken: domain.NewSecret(at), RefreshToken: domain.NewSecret("rt-" + at), Expiry: time.Now().Add(time.Hour)}
	}
	if _, err := uc.ConnectGrant(ctx, "acme", grant("a1"), usecase.ConnectRequest{Binding: domain.Binding{Account: "1234"}}); err != nil {
		t.Fatal(err)
	}
	_, err := uc.ConnectGrant(ctx, "acme", grant("a2"), usecase.ConnectRequest{Binding: domain.Binding{Account: "1234"}, Provider: "other"})
	if !errors.Is(err, domain.ErrAccountMismatch) {
		t.Errorf("account 1234 at another provider: %v, want ErrAccountMismatch", err)
	}
	if _, err := uc.ConnectGrant(ctx, "acme", grant("a3"), usecase.ConnectRequest{Binding: domain.Binding{Account: "1234"}}); err != nil {
		t.Errorf("control: account 1234 at the same provider again: %v", err)
	}
	if _, err := uc.ConnectGrant(ctx, "acme", grant("a4"), usecase.ConnectRequest{Binding: domain.Binding{Account: "x\nforged"}, AllowAccountChange: true}); !errors.Is(err, domain.ErrInvalidAccount) {
		t.Errorf("an unprintable account id: %v, want ErrInvalidAccount", err)
	}
}
