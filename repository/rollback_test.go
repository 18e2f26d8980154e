package repository_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// refuseRefresh is a provider that must not be called.
type refuseRefresh struct{ calls atomic.Int64 }

func (r *refuseRefresh) Refresh(context.Context, domain.Secret) (domain.Grant, error) {
	r.calls.Add(1)
	return domain.Grant{}, errors.New("no refresh expected")
}

// TestRollbackNeedsTheKey: someone with write access to the table, but not
// the key, copies an earlier version's ciphertexts back into the row
// together with that version's sealed_version, leaving the version column
// (what the rollback check reads) as it is. The ciphertexts are bound to
// the row's version, so they do not open (a typed error), and the
// connection is not served the earlier token. The control: the earlier
// bound form, bound to the sealed_version column, lets the same copy
// through; it still opens (rolling deploys) until tokenctl rotate-key,
// after which a process that starts refuses it. Reactivate, which gives
// the row a new version without a new token, seals again: its earlier
// ciphertexts do not open either.
func TestRollbackNeedsTheKey(t *testing.T) {
	_, db, _ := newRepo(t)
	k1 := keyring(t, "k1="+testKey1)
	r := repository.NewTokenRepository(db, k1)
	ctx := context.Background()
	type raw struct {
		ID                        int32
		AccessToken, RefreshToken string
		Version                   int64
		SealedVersion             *int64
	}
	read := func() raw {
		t.Helper()
		var row raw
		if err := db.Raw(`SELECT c.id, t.access_token, t.refresh_token, t.version, t.sealed_version FROM tokenguard_tokens t
JOIN tokenguard_connections c ON c.id = t.connection_id WHERE c.name = 'acme'`).Scan(&row).Error; err != nil {
			t.Fatal(err)
		}
		return row
	}
	// copyBack is the attack: ciphertexts and sealed_version written back,
	// the version column left alone.
	copyBack := func(from raw) {
		t.Helper()
		if err := db.Exec(`UPDATE tokenguard_tokens SET access_token = ?, refresh_token = ?, sealed_version = ? WHERE connection_id = ?`,
			from.AccessToken, from.RefreshToken, from.SealedVersion, from.ID).Error; err != nil {
			t.Fatal(err)
		}
	}
	refused := func(what string, repo *repository.TokenRepository) {
		t.Helper()
		got, err := repo.Get(ctx, "acme")
		var oe *tokencrypt.OpenError
		if !errors.Is(err, domain.ErrUndecryptable) || !got.AccessToken.IsZero() || !strings.Contains(err.Error(), "acme") {
			t.Errorf("%s: Get = %q, %v; want ErrUndecryptable naming acme and no token", what, got.AccessToken.Reveal(), err)
		} else if !errors.As(err, &oe) && !strings.Contains(err.Error(), "sealed_version") {
			t.Errorf("%s: %v is neither an OpenError nor the refusal of the sealed_version form", what, err)
		}
		if got, _, err := repo.Read(ctx, "acme"); !errors.Is(err, domain.ErrUndecryptable) || !got.RefreshToken.IsZero() {
			t.Errorf("%s: Read = %v", what, err)
		}
		// Served through the use case (a fresh one: nothing cached): an
		// error, never the earlier token, and the provider is not called.
		prov := &refuseRefresh{}
		uc, err := usecase.NewRefreshTokenUseCase(repo, provider.Only(prov), usecase.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if tok, err := uc.Token(ctx, "acme"); !errors.Is(err, domain.ErrUndecryptable) || !tok.AccessToken.IsZero() {
			t.Errorf("%s: use case Token = %q, %v; want ErrUndecryptable", what, tok.AccessToken.Reveal(), err)
		}
		if prov.calls.Load() != 0 {
			t.Errorf("%s: the provider was called", what)
		}
	}
	opens := func(what string, repo *repository.TokenRepository, wantAT string) {
		t.Helper()
		got, err := repo.Get(ctx, "acme")
		if err != nil || got.AccessToken.Reveal() != wantAT {
			t.Fatalf("%s: Get = %q, %v; want %q", what, got.AccessToken.Reveal(), err, wantAT)
		}
	}
	store := func(at, rt string) {
		t.Helper()
		cur, err := r.Get(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		next := cur.Rotated(domain.Grant{AccessToken: domain.NewSecret(at), RefreshToken: domain.NewSecret(rt), Expiry: time.Now().Add(time.Hour)}, time.Now())
		if _, err := r.Store(ctx, next); err != nil {
			t.Fatal(err)
		}
	}

	put(t, r, grantToken("acme", "at-1", "rt-1"))
	v1 := read()
	store("at-2", "rt-2")
	store("at-3", "rt-3")
	cur := read()
	if v1.SealedVersion != nil || cur.SealedVersion != nil || cur.Version != v1.Version+2 {
		t.Fatalf("rows: %+v then %+v; want sealed_version NULL (bound to the version)", v1, cur)
	}

	// The attack on rows of this release: refused.
	copyBack(v1)
	refused("version 1 copied back", r)
	// Relabelled as the earlier form, at the version it was sealed at: refused.
	relabelled := v1
	relabelled.SealedVersion = &v1.Version
	copyBack(relabelled)
	refused("version 1 copied back labelled sealed_version 1", r)
	copyBack(cur)
	opens("the current ciphertexts", r, "at-3")

	// Reactivate gives the row a new version and seals again.
	cur0, err := r.Get(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	cur0.Status, cur0.StatusReason = domain.StatusNeedsReauth, "invalid_client"
	if _, err := r.Store(ctx, cur0); err != nil {
		t.Fatal(err)
	}
	before := read()
	if _, v, err := r.Reactivate(ctx, "acme", "", time.Second); err != nil || v != before.Version+1 {
		t.Fatalf("Reactivate = %d, %v", v, err)
	}
	after := read()
	if after.AccessToken == before.AccessToken || after.RefreshToken == before.RefreshToken || after.SealedVersion != nil {
		t.Fatalf("Reactivate did not seal again: %+v", after)
	}
	opens("after reactivate", r, "at-3")
	copyBack(before)
	refused("the ciphertexts from before reactivate", r)
	copyBack(after)

	// Control: the earlier bound form (as the previous release sealed it,
	// bound to the sealed_version column). Its rows open ...
	earlier := func(version int64, at, rt string) raw {
		t.Helper()
		seal := func(pt, col string) string {
			v, err := k1.Seal(pt, "c"+strconv.Itoa(int(after.ID))+"/v"+strconv.FormatInt(version, 10)+"/"+col)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		return raw{ID: after.ID, AccessToken: seal(at, "access_token"), RefreshToken: seal(rt, "refresh_token"), SealedVersion: &version}
	}
	copyBack(earlier(after.Version, "at-4", "rt-4"))
	opens("a row of the earlier form", r, "at-4")
	// ... and the same copy of an earlier version's ciphertexts opens: the
	// old token served labelled with the current version.
	copyBack(earlier(v1.Version, "at-old", "rt-old"))
	opens("control: the earlier form's copy back", r, "at-old")

	// rotate-key seals every row bound to its version; from then on a
	// process that starts refuses the earlier form.
	copyBack(earlier(after.Version, "at-4", "rt-4"))
	if res, err := r.Reseal(ctx, 0, time.Second); err != nil || res.Resealed != 1 || !res.OnlyBound {
		t.Fatalf("Reseal = %+v, %v", res, err)
	}
	resealed := read()
	if resealed.SealedVersion != nil {
		t.Fatalf("after rotate-key: %+v", resealed)
	}
	var versioned bool
	if err := db.Raw(`SELECT versioned FROM tokenguard_seal_state`).Scan(&versioned).Error; err != nil || !versioned {
		t.Fatalf("seal state versioned = %v, %v", versioned, err)
	}
	started := repository.NewTokenRepository(db, k1)
	if _, err := started.CheckKeys(ctx); err != nil {
		t.Fatal(err)
	}
	opens("after rotate-key", started, "at-4")
	copyBack(earlier(v1.Version, "at-old", "rt-old"))
	refused("the earlier form after rotate-key", started)
	copyBack(earlier(resealed.Version, "at-4", "rt-4"))
	refused("the earlier form at the current version after rotate-key", started)
	copyBack(resealed)
	opens("the resealed row", started, "at-4")
}
