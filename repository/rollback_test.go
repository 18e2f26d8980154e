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
	"gorm.io/gorm"
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
	g := &rollbackRig{t: t, db: db, k1: k1, r: repository.NewTokenRepository(db, k1)}
	ctx := context.Background()
	put(t, g.r, grantToken("acme", "at-1", "rt-1"))
	v1 := g.read()
	g.store("at-2", "rt-2")
	g.store("at-3", "rt-3")
	cur := g.read()
	if v1.SealedVersion != nil || cur.SealedVersion != nil || cur.Version != v1.Version+2 {
		t.Fatalf("rows: %+v then %+v; want sealed_version NULL (bound to the version)", v1, cur)
	}

	// The attack on rows of this release: refused.
	g.copyBack(v1)
	g.refused("version 1 copied back", g.r)
	// Relabelled as the earlier form, at the version it was sealed at: refused.
	relabelled := v1
	relabelled.SealedVersion = &v1.Version
	g.copyBack(relabelled)
	g.refused("version 1 copied back labelled sealed_version 1", g.r)
	g.copyBack(cur)
	g.opens("the current ciphertexts", g.r, "at-3")

	// Reactivate gives the row a new version and seals again.
	cur0, err := g.r.Get(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	cur0.Status, cur0.StatusReason = domain.StatusNeedsReauth, "invalid_client"
	if _, err := g.r.Store(ctx, cur0); err != nil {
		t.Fatal(err)
	}
	before := g.read()
	if _, v, err := g.r.Reactivate(ctx, "acme", "", time.Second); err != nil || v != before.Version+1 {
		t.Fatalf("Reactivate = %d, %v", v, err)
	}
	after := g.read()
	if after.AccessToken == before.AccessToken || after.RefreshToken == before.RefreshToken || after.SealedVersion != nil {
		t.Fatalf("Reactivate did not seal again: %+v", after)
	}
	g.opens("after reactivate", g.r, "at-3")
	g.copyBack(before)
	g.refused("the ciphertexts from before reactivate", g.r)
	g.copyBack(after)

	// Control: the earlier bound form (as the previous release sealed it,
	// bound to the sealed_version column). Its rows open ...
	g.copyBack(g.earlier(after.ID, after.Version, "at-4", "rt-4"))
	g.opens("a row of the earlier form", g.r, "at-4")
	// ... and the same copy of an earlier version's ciphertexts opens: the
	// old token served labelled with the current version.
	g.copyBack(g.earlier(after.ID, v1.Version, "at-old", "rt-old"))
	g.opens("control: the earlier form's copy back", g.r, "at-old")

	// rotate-key seals every row bound to its version; from then on a
	// process that starts refuses the earlier form.
	g.copyBack(g.earlier(after.ID, after.Version, "at-4", "rt-4"))
	if res, err := g.r.Reseal(ctx, 0, time.Second); err != nil || res.Resealed != 1 || !res.OnlyBound {
		t.Fatalf("Reseal = %+v, %v", res, err)
	}
	resealed := g.read()
	if resealed.SealedVersion != nil {
		t.Fatalf("after rotate-key: %+v", resealed)
	}
	var versioned bool
	if err := g.db.Raw(`SELECT versioned FROM tokenguard_seal_state`).Scan(&versioned).Error; err != nil || !versioned {
		t.Fatalf("seal state versioned = %v, %v", versioned, err)
	}
	started := repository.NewTokenRepository(g.db, g.k1)
	if _, err := started.CheckKeys(ctx); err != nil {
		t.Fatal(err)
	}
	g.opens("after rotate-key", started, "at-4")
	g.copyBack(g.earlier(after.ID, v1.Version, "at-old", "rt-old"))
	g.refused("the earlier form after rotate-key", started)
	g.copyBack(g.earlier(after.ID, resealed.Version, "at-4", "rt-4"))
	g.refused("the earlier form at the current version after rotate-key", started)
	g.copyBack(resealed)
	g.opens("the resealed row", started, "at-4")
}

// rollbackRig reads and writes acme's row behind the repository's back.
type rollbackRig struct {
	t  *testing.T
	db *gorm.DB
	k1 *tokencrypt.Keyring
	r  *repository.TokenRepository
}

// sealedRow is acme's row as stored.
type sealedRow struct {
	ID                        int32
	AccessToken, RefreshToken string
	Version                   int64
	SealedVersion             *int64
}

func (g *rollbackRig) read() sealedRow {
	g.t.Helper()
	var row sealedRow
	if err := g.db.Raw(`SELECT c.id, t.access_token, t.refresh_token, t.version, t.sealed_version FROM tokenguard_tokens t
JOIN tokenguard_connections c ON c.id = t.connection_id WHERE c.name = 'acme'`).Scan(&row).Error; err != nil {
		g.t.Fatal(err)
	}
	return row
}

// copyBack is the attack: ciphertexts and sealed_version written back,
// the version column left alone.
func (g *rollbackRig) copyBack(from sealedRow) {
	g.t.Helper()
	if err := g.db.Exec(`UPDATE tokenguard_tokens SET access_token = ?, refresh_token = ?, sealed_version = ? WHERE connection_id = ?`,
		from.AccessToken, from.RefreshToken, from.SealedVersion, from.ID).Error; err != nil {
		g.t.Fatal(err)
	}
}

// refused: repo does not open acme's row (a typed error naming it), and a
// fresh use case serves an error, never the earlier token, without
// calling the provider.
func (g *rollbackRig) refused(what string, repo *repository.TokenRepository) {
	t, ctx := g.t, context.Background()
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

func (g *rollbackRig) opens(what string, repo *repository.TokenRepository, wantAT string) {
	g.t.Helper()
	got, err := repo.Get(context.Background(), "acme")
	if err != nil || got.AccessToken.Reveal() != wantAT {
		g.t.Fatalf("%s: Get = %q, %v; want %q", what, got.AccessToken.Reveal(), err, wantAT)
	}
}

// store rotates acme's token to at and rt through the repository.
func (g *rollbackRig) store(at, rt string) {
	g.t.Helper()
	ctx := context.Background()
	cur, err := g.r.Get(ctx, "acme")
	if err != nil {
		g.t.Fatal(err)
	}
	next := cur.Rotated(domain.Grant{AccessToken: domain.NewSecret(at), RefreshToken: domain.NewSecret(rt), Expiry: time.Now().Add(time.Hour)}, time.Now())
	if _, err := g.r.Store(ctx, next); err != nil {
		g.t.Fatal(err)
	}
}

// earlier seals at and rt in the earlier bound form (as the previous
// release sealed it, bound to the sealed_version column).
func (g *rollbackRig) earlier(id int32, version int64, at, rt string) sealedRow {
	g.t.Helper()
	seal := func(pt, col string) string {
		v, err := g.k1.Seal(pt, "c"+strconv.Itoa(int(id))+"/v"+strconv.FormatInt(version, 10)+"/"+col)
		if err != nil {
			g.t.Fatal(err)
		}
		return v
	}
	return sealedRow{ID: id, AccessToken: seal(at, "access_token"), RefreshToken: seal(rt, "refresh_token"), SealedVersion: &version}
}
