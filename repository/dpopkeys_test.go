package repository_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/dpop"
	"github.com/tokenguard/tokenguard/repository"
)

// TestDPoPKeySealedWithTheGrant: a bound grant's key is stored sealed in
// the grant's transaction, opens only for its own connection and
// thumbprint, survives refreshes, is resealed by a key rotation, and a new
// bearer grant drops it.
func TestDPoPKeySealedWithTheGrant(t *testing.T) {
	_, db, _ := newRepo(t)
	r := repository.NewTokenRepository(db, keyring(t, "k1="+testKey1))
	ctx := context.Background()
	k, _ := dpop.Generate()
	pem := string(k.MarshalPEM())
	tok := grantToken("bound", "at-bound", "rt-bound")
	tok.DPoPKey, tok.DPoPJKT = domain.NewSecret(pem), k.Thumbprint()
	stored := put(t, r, tok)
	put(t, r, grantToken("other", "at-other", "rt-other"))
	if stored.DPoPJKT != k.Thumbprint() || !stored.DPoPKey.IsZero() {
		t.Fatalf("put returned binding %q, key set %v", stored.DPoPJKT, !stored.DPoPKey.IsZero())
	}
	var raw string
	if err := db.Raw(`SELECT private_key FROM tokenguard_dpop_keys`).Scan(&raw).Error; err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(raw, "tg1:k1:") || strings.Contains(raw, "PRIVATE") {
		t.Fatalf("stored key is not an envelope: %.20q", raw)
	}
	got, err := r.DPoPKey(ctx, "bound", k.Thumbprint())
	if err != nil || got.Reveal() != pem {
		t.Fatalf("DPoPKey: %v (equal %v)", err, got.Reveal() == pem)
	}
	// A refresh keeps the binding.
	next := stored
	next.AccessToken = domain.NewSecret("at-2")
	if _, err := r.Store(ctx, next); err != nil {
		t.Fatal(err)
	}
	if cur, _ := r.Get(ctx, "bound"); cur.DPoPJKT != k.Thumbprint() {
		t.Fatalf("binding after a refresh: %q", cur.DPoPJKT)
	}
	// Copied to another connection, the envelope does not open there.
	if err := db.Exec(`INSERT INTO tokenguard_dpop_keys (connection_id, jkt, private_key)
SELECT c.id, k.jkt, k.private_key FROM tokenguard_dpop_keys k, tokenguard_connections c WHERE c.name = 'other'`).Error; err != nil {
		t.Fatal(err)
	}
	fresh := repository.NewTokenRepository(db, keyring(t, "k1="+testKey1))
	if _, err := fresh.DPoPKey(ctx, "other", k.Thumbprint()); !errors.Is(err, domain.ErrUndecryptable) {
		t.Fatalf("a key copied to another connection: %v, want ErrUndecryptable", err)
	}
	// Rotation reseals it under the new key.
	rotated := repository.NewTokenRepository(db, keyring(t, "k2="+testKey2+"*,k1="+testKey1))
	if _, err := rotated.Reseal(ctx, 10, 0); err == nil || !errors.Is(err, domain.ErrUndecryptable) {
		// the copied (foreign) envelope cannot be resealed: rotation says so rather than skip it
		t.Fatalf("reseal with a foreign envelope: %v, want ErrUndecryptable", err)
	}
	db.Exec(`DELETE FROM tokenguard_dpop_keys k USING tokenguard_connections c WHERE c.id = k.connection_id AND c.name = 'other'`)
	if _, err := rotated.Reseal(ctx, 10, 0); err != nil {
		t.Fatal(err)
	}
	db.Raw(`SELECT private_key FROM tokenguard_dpop_keys`).Scan(&raw)
	if !strings.HasPrefix(raw, "tg1:k2:") {
		t.Fatalf("after rotation the key is under %.8q, want k2", raw)
	}
	if got, err := rotated.DPoPKey(ctx, "bound", k.Thumbprint()); err != nil || got.Reveal() != pem {
		t.Fatalf("after rotation: %v", err)
	}
	// A new bearer grant drops the key and the binding.
	put(t, rotated, grantToken("bound", "at-3", "rt-3"))
	var n int64
	db.Raw(`SELECT count(*) FROM tokenguard_dpop_keys`).Scan(&n)
	if cur, _ := rotated.Get(ctx, "bound"); cur.DPoPJKT != "" || n != 0 {
		t.Fatalf("after a bearer grant: binding %q, %d keys kept", cur.DPoPJKT, n)
	}
}
