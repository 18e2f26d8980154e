package repository_test

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/repository"
)

// legacySeal is an envelope as the previous release sealed it: additional
// data "tg1:<id>:" + "<connection>/<column>", no form mark.
func legacySeal(t *testing.T, key []byte, id, connection, column, plaintext string) string {
	t.Helper()
	block, err := aes.NewCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	gcm, _ := cipher.NewGCM(block)
	nonce := make([]byte, 12)
	_, _ = rand.Read(nonce)
	out := gcm.Seal(nonce, nonce, []byte(plaintext), []byte("tg1:"+id+":"+connection+"/"+column))
	return "tg1:" + id + ":" + base64.RawURLEncoding.EncodeToString(out)
}

type cipherRow struct {
	AccessToken, RefreshToken string
	Version                   int64
	SealedVersion             *int64
}

// TestSealedRowsBoundToIDAndVersion: a ciphertext copied back into its row
// after a later write, or moved from another connection, does not open
// (typed error); the current one copied back does (control). Rows sealed by
// the previous release open, and rotate-key reseals them in the bound
// form; that form, the control for the old behaviour, would have opened a
// rolled-back value, and once rotate-key has resealed every row a process
// that starts refuses it. A version bump without a reseal (reactivate) and a
// Save that keeps the refresh token still open.
func TestSealedRowsBoundToIDAndVersion(t *testing.T) {
	_, db, _ := newRepo(t)
	k1 := keyring(t, "k1="+testKey1)
	r := repository.NewTokenRepository(db, k1)
	ctx := context.Background()
	read := func(name string) cipherRow {
		var row cipherRow
		if err := db.Raw(`SELECT t.access_token, t.refresh_token, t.version, t.sealed_version FROM tokenguard_tokens t JOIN tokenguard_connections c ON c.id = t.connection_id WHERE c.name = ?`, name).Scan(&row).Error; err != nil {
			t.Fatal(err)
		}
		return row
	}
	write := func(name, access, refresh string) {
		if err := db.Exec(`UPDATE tokenguard_tokens SET access_token = ?, refresh_token = ? WHERE connection_id = (SELECT id FROM tokenguard_connections WHERE name = ?)`, access, refresh, name).Error; err != nil {
			t.Fatal(err)
		}
	}
	save := func(name string, next func(domain.Token) domain.Token) {
		t.Helper()
		cur, err := r.Get(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Store(ctx, next(cur)); err != nil {
			t.Fatal(err)
		}
	}
	put(t, r, grantToken("acme", "at-1", "rt-1"))
	put(t, r, grantToken("other", "at-o", "rt-o"))
	old := read("acme")
	if !strings.HasPrefix(old.RefreshToken, "tg1:k1:b:") || old.SealedVersion != nil {
		t.Fatalf("a new row: %+v, want the bound form, bound to its version (sealed_version NULL)", old)
	}
	save("acme", func(c domain.Token) domain.Token {
		return c.Rotated(domain.Grant{AccessToken: domain.NewSecret("at-2"), RefreshToken: domain.NewSecret("rt-2"), Expiry: time.Now().Add(time.Hour)}, time.Now())
	})
	cur := read("acme")

	// Control: the current ciphertexts written back open.
	write("acme", cur.AccessToken, cur.RefreshToken)
	if got, err := r.Get(ctx, "acme"); err != nil || got.RefreshToken.Reveal() != "rt-2" {
		t.Fatalf("control: %v", err)
	}
	// Rolled back: refused, nothing returned.
	write("acme", old.AccessToken, old.RefreshToken)
	if got, err := r.Get(ctx, "acme"); !errors.Is(err, domain.ErrUndecryptable) || !got.AccessToken.IsZero() || !strings.Contains(err.Error(), "acme") {
		t.Errorf("rolled back: %v, %+v", err, got)
	}
	// Moved from another connection: refused.
	o := read("other")
	write("acme", o.AccessToken, o.RefreshToken)
	if _, err := r.Get(ctx, "acme"); !errors.Is(err, domain.ErrUndecryptable) {
		t.Errorf("moved from other: %v", err)
	}
	write("acme", cur.AccessToken, cur.RefreshToken)

	// The previous release's rows open (rolling deploy) ...
	key1, _ := base64.StdEncoding.DecodeString(testKey1)
	legacyOld := [2]string{legacySeal(t, key1, "k1", "acme", "access_token", "at-old"), legacySeal(t, key1, "k1", "acme", "refresh_token", "rt-old")}
	legacyNew := [2]string{legacySeal(t, key1, "k1", "acme", "access_token", "at-3"), legacySeal(t, key1, "k1", "acme", "refresh_token", "rt-3")}
	write("acme", legacyNew[0], legacyNew[1])
	if got, err := r.Get(ctx, "acme"); err != nil || got.RefreshToken.Reveal() != "rt-3" {
		t.Fatalf("a row of the previous release: %v", err)
	}
	// ... and that form is what the binding fixes: its rolled-back value
	// opens (the control for the old behaviour).
	write("acme", legacyOld[0], legacyOld[1])
	if got, err := r.Get(ctx, "acme"); err != nil || got.RefreshToken.Reveal() != "rt-old" {
		t.Fatalf("control: the previous form's rollback: %v", err)
	}
	write("acme", legacyNew[0], legacyNew[1])
	// rotate-key reseals it in the bound form.
	if res, err := r.Reseal(ctx, 0, time.Second); err != nil || res.Resealed != 1 || !res.OnlyBound {
		t.Fatalf("Reseal = %+v, %v", res, err)
	}
	resealed := read("acme")
	if !strings.HasPrefix(resealed.RefreshToken, "tg1:k1:b:") || !strings.HasPrefix(resealed.AccessToken, "tg1:k1:b:") {
		t.Fatalf("after rotate-key: %+v", resealed)
	}
	if got, err := r.Get(ctx, "acme"); err != nil || got.RefreshToken.Reveal() != "rt-3" {
		t.Fatalf("after rotate-key: %v", err)
	}
	// From then on a process that starts refuses the previous form: the
	// rollback the control above let through.
	started := repository.NewTokenRepository(db, k1)
	if _, err := started.CheckKeys(ctx); err != nil {
		t.Fatal(err)
	}
	write("acme", legacyOld[0], legacyOld[1])
	if _, err := started.Get(ctx, "acme"); !errors.Is(err, domain.ErrUndecryptable) {
		t.Errorf("the previous form after rotate-key: %v, want ErrUndecryptable", err)
	}
	write("acme", resealed.AccessToken, resealed.RefreshToken)
	if got, err := started.Get(ctx, "acme"); err != nil || got.RefreshToken.Reveal() != "rt-3" {
		t.Fatalf("the bound form after rotate-key: %v", err)
	}
	// A version bump without a reseal, and a Save that keeps the refresh
	// token: still open.
	save("acme", func(c domain.Token) domain.Token {
		c.Status, c.StatusReason = domain.StatusNeedsReauth, "invalid_client"
		return c
	})
	if _, _, err := r.Reactivate(ctx, "acme", "", time.Second); err != nil {
		t.Fatal(err)
	}
	save("acme", func(c domain.Token) domain.Token {
		c.AccessToken, c.RefreshToken = domain.NewSecret("at-4"), domain.Secret{}
		return c
	})
	if got, err := r.Get(ctx, "acme"); err != nil || got.RefreshToken.Reveal() != "rt-3" || got.AccessToken.Reveal() != "at-4" {
		t.Fatalf("after reactivate and a Save keeping the refresh token: %+v, %v", got, err)
	}
	if !bytes.Contains([]byte(read("acme").RefreshToken), []byte(":b:")) {
		t.Error("the kept refresh token was not resealed")
	}
}
