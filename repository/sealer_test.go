package repository_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/internal/waitfor"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// These tests run the repository with a real keyring against a real Postgres.

var (
	testKey1 = base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0x11}, 32))
	testKey2 = base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0x22}, 32))
)

func keyring(t *testing.T, spec string) *tokencrypt.Keyring {
	t.Helper()
	k, err := tokencrypt.ParseKeyring(spec)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

type rawRow struct {
	Name         string
	AccessToken  string
	RefreshToken string
	Version      int64
}

func TestSealedColumnsHoldEnvelopes(t *testing.T) {
	plain, db, _ := newRepo(t)
	k1 := keyring(t, "k1="+testKey1)
	r := repository.NewTokenRepository(db, k1)
	ctx := context.Background()

	put(t, r, grantToken("acme", "at-secret-acme", "rt-secret-acme"))
	put(t, r, grantToken("other", "at-secret-other", "rt-secret-other"))
	assertSealed := func(keyID string) {
		t.Helper()
		var rows []rawRow
		if err := db.Raw(`SELECT c.name, t.access_token, t.refresh_token, t.version FROM tokenguard_tokens t JOIN tokenguard_connections c ON c.id = t.connection_id`).Scan(&rows).Error; err != nil {
			t.Fatal(err)
		}
		for _, row := range rows {
			for _, v := range []string{row.AccessToken, row.RefreshToken} {
				if !strings.HasPrefix(v, "tg1:"+keyID+":") || strings.Contains(v, "secret") {
					t.Fatalf("%s: stored %q, want an envelope under %s", row.Name, v, keyID)
				}
			}
		}
		var n int64
		db.Raw(`SELECT count(*) FROM tokenguard_tokens WHERE access_token LIKE '%secret%' OR refresh_token LIKE '%secret%'`).Scan(&n)
		if n != 0 || len(rows) != 2 {
			t.Fatalf("%d of %d rows hold a token in the clear", n, len(rows))
		}
	}
	assertSealed("k1")

	got, err := r.Get(ctx, "acme")
	if err != nil || got.AccessToken.Reveal() != "at-secret-acme" || got.RefreshToken.Reveal() != "rt-secret-acme" {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	// Store seals too, and keeps the stored refresh token when given none.
	next := got
	next.AccessToken, next.RefreshToken = domain.NewSecret("at-secret-2"), domain.Secret{}
	saved, err := r.Store(ctx, next)
	if err != nil {
		t.Fatal(err)
	}
	if saved.AccessToken.Reveal() != "at-secret-2" || saved.RefreshToken.Reveal() != "rt-secret-acme" {
		t.Errorf("saved %q / %q", saved.AccessToken.Reveal(), saved.RefreshToken.Reveal())
	}
	assertSealed("k1")
	if all, err := r.List(ctx); err != nil || len(all) != 2 || all[0].RefreshToken.Reveal() != "rt-secret-acme" {
		t.Fatalf("List = %v, %v", all, err)
	}

	// A process without the key, or without any keys, gets a typed error
	// naming the connection and the key id, never an envelope as a token.
	for name, other := range map[string]*repository.TokenRepository{
		"no keys":     plain,
		"another key": repository.NewTokenRepository(db, keyring(t, "k2="+testKey2)),
	} {
		_, err := other.Get(ctx, "acme")
		if !errors.Is(err, domain.ErrUndecryptable) || !strings.Contains(err.Error(), "acme") || !strings.Contains(err.Error(), `"k1"`) {
			t.Errorf("%s: Get err = %v, want ErrUndecryptable naming acme and k1", name, err)
		}
		if _, err := other.List(ctx); !errors.Is(err, domain.ErrUndecryptable) {
			t.Errorf("%s: List err = %v", name, err)
		}
	}

	// Ciphertexts moved between columns or rows do not open.
	for name, sql := range map[string]string{
		"columns swapped": `UPDATE tokenguard_tokens SET access_token = refresh_token, refresh_token = access_token
			WHERE connection_id = (SELECT id FROM tokenguard_connections WHERE name = 'acme')`,
		"rows swapped": `UPDATE tokenguard_tokens SET refresh_token = (SELECT t2.refresh_token FROM tokenguard_tokens t2 JOIN tokenguard_connections c2 ON c2.id = t2.connection_id WHERE c2.name = 'other')
			WHERE connection_id = (SELECT id FROM tokenguard_connections WHERE name = 'acme')`,
	} {
		tx := db.Begin()
		if err := tx.Exec(sql).Error; err != nil {
			t.Fatal(err)
		}
		inTx := repository.NewTokenRepository(tx, k1)
		if _, err := inTx.Get(ctx, "acme"); !errors.Is(err, domain.ErrUndecryptable) {
			t.Errorf("%s: err = %v, want ErrUndecryptable", name, err)
		}
		tx.Rollback()
	}
}

func TestResealRotatesKeysWhileRefreshing(t *testing.T) {
	plainRepo, db, url := newRepo(t)
	ctx := context.Background()
	const n = 30
	names := putMixedSealing(t, db, plainRepo, n)

	// The reseal runs with k2 current and k1 still known. Another process,
	// still configured with k1 current, refreshes a few connections over
	// and over meanwhile, so those rows keep going back to k1 and the
	// reseal keeps finding work on connections that are being refreshed.
	ring := keyring(t, "k2="+testKey2+"*,k1="+testKey1)
	r := repository.NewTokenRepository(db, ring)
	refresher := repository.NewTokenRepository(open(t, url), keyring(t, "k1="+testKey1+"*,k2="+testKey2))
	hot := []string{"c00", "c01", "c07", "c12", "c13", "c20", "c26", "c29"}
	h := startHotRefreshers(t, refresher, hot)
	// The bounds only fail the test: under -race beside the other packages' tests, a few
	// refreshes of eight connections have taken more than 5 s.
	waitfor.Until(t, 30*time.Second, "refreshers did not start", h.savedAtLeast(3))
	versions := map[string]int64{}
	for _, name := range names {
		tok, err := r.Get(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		versions[name] = tok.Version
	}
	res, err := r.Reseal(ctx, 7, 5*time.Second) // several batches
	after := h.saves[0].Load()
	waitfor.Until(t, 30*time.Second, "refreshers stalled", h.savedAtLeast(after+3))
	h.halt()
	if err != nil {
		t.Fatal(err)
	}
	if res.Resealed+res.Current != n || res.Resealed < n-len(hot) {
		t.Errorf("Reseal = %+v, want %d rows, at least %d resealed", res, n, n-len(hot))
	}
	// The hot rows went back to k1 with the refreshes after the reseal; a
	// second run (all processes on k2 by now) takes them.
	if res, err := r.Reseal(ctx, 0, time.Second); err != nil || res.Resealed > len(hot) || res.Resealed+res.Current != n {
		t.Errorf("second Reseal = %+v, %v", res, err)
	}

	checkAllSealedWithK2(t, db)
	h.checkNoLostUpdate(t, r)
	checkResealChangedNoToken(t, r, names, hot, versions)
	// k1 can go now.
	onlyK2 := repository.NewTokenRepository(db, keyring(t, "k2="+testKey2))
	if kc, err := onlyK2.CheckKeys(ctx); err != nil || kc.Stale != 0 {
		t.Errorf("CheckKeys after reseal = %+v, %v", kc, err)
	}
	// A third run finds nothing to do.
	if res, err := r.Reseal(ctx, 0, time.Second); err != nil || res.Resealed != 0 || res.Current != n {
		t.Errorf("second Reseal = %+v, %v", res, err)
	}
}

// putMixedSealing stores n connections c00, c01, ..., sealed with k1 but
// for every fifth, written before encryption was turned on, and returns
// their names.
func putMixedSealing(t *testing.T, db *gorm.DB, plainRepo *repository.TokenRepository, n int) []string {
	t.Helper()
	k1 := repository.NewTokenRepository(db, keyring(t, "k1="+testKey1))
	names := make([]string, n)
	for i := range n {
		names[i] = fmt.Sprintf("c%02d", i)
		r := k1
		if i%5 == 0 {
			r = plainRepo // written before encryption was turned on
		}
		put(t, r, grantToken(names[i], "at-"+names[i], "rt-"+names[i]))
	}
	var plainBefore int64
	db.Raw(`SELECT count(*) FROM tokenguard_tokens WHERE refresh_token NOT LIKE 'tg1:%'`).Scan(&plainBefore)
	if plainBefore != int64(n/5) {
		t.Fatalf("%d plaintext rows, want %d", plainBefore, n/5)
	}
	return names
}

// hotRefreshers refresh each of names over and over through one
// repository until halted, each refresh checking that it found what the
// previous one stored.
type hotRefreshers struct {
	names []string
	stop  chan struct{}
	wg    sync.WaitGroup
	last  []string       // the refresh token each one saved last
	saves []atomic.Int64 // the refreshes each one saved
}

func startHotRefreshers(t *testing.T, refresher *repository.TokenRepository, names []string) *hotRefreshers {
	h := &hotRefreshers{names: names, stop: make(chan struct{}), last: make([]string, len(names)), saves: make([]atomic.Int64, len(names))}
	for i, name := range names {
		h.wg.Go(func() {
			for j := 0; ; j++ {
				select {
				case <-h.stop:
					return
				default:
				}
				rt := fmt.Sprintf("rt-%s-%d", name, j)
				if err := refreshOnce(refresher, name, j, rt); err != nil {
					t.Errorf("refresh %s: %v", name, err)
					return
				}
				h.last[i] = rt
				h.saves[i].Add(1)
			}
		})
	}
	return h
}

// refreshOnce is the j-th refresh of name: it must find the refresh
// token of the (j-1)-th, and stores rt.
func refreshOnce(refresher *repository.TokenRepository, name string, j int, rt string) error {
	ctx := context.Background()
	prev := "rt-" + name
	if j > 0 {
		prev = fmt.Sprintf("rt-%s-%d", name, j-1)
	}
	cur, err := refresher.Get(ctx, name)
	if err != nil {
		return err
	}
	// Each refresh must find what the previous one stored:
	// a reseal that wrote back an older read would show here.
	if got := cur.RefreshToken.Reveal(); got != prev {
		return fmt.Errorf("lost update: found %q, want %q", got, prev)
	}
	// Version-fenced: a reseal keeps the version.
	_, err = refresher.Store(ctx, cur.Rotated(domain.Grant{AccessToken: domain.NewSecret("at-" + rt), RefreshToken: domain.NewSecret(rt)}, time.Now()))
	return err
}

// savedAtLeast holds once every refresher saved min refreshes.
func (h *hotRefreshers) savedAtLeast(min int64) func() bool {
	return func() bool {
		for i := range h.saves {
			if h.saves[i].Load() < min {
				return false
			}
		}
		return true
	}
}

func (h *hotRefreshers) halt() { close(h.stop); h.wg.Wait() }

// checkNoLostUpdate: every hot connection holds the last token its
// refresher saved, at one version per save.
func (h *hotRefreshers) checkNoLostUpdate(t *testing.T, r *repository.TokenRepository) {
	t.Helper()
	for i, name := range h.names {
		tok, err := r.Get(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		if n := h.saves[i].Load(); tok.RefreshToken.Reveal() != h.last[i] || tok.Version != 1+n {
			t.Errorf("%s: rt %q version %d, want %q version %d", name, tok.RefreshToken.Reveal(), tok.Version, h.last[i], 1+n)
		}
	}
}

// checkAllSealedWithK2: every stored token is sealed with k2.
func checkAllSealedWithK2(t *testing.T, db *gorm.DB) {
	t.Helper()
	var rows []rawRow
	db.Raw(`SELECT c.name, t.access_token, t.refresh_token, t.version FROM tokenguard_tokens t JOIN tokenguard_connections c ON c.id = t.connection_id ORDER BY c.name`).Scan(&rows)
	for _, row := range rows {
		if !strings.HasPrefix(row.AccessToken, "tg1:k2:") || !strings.HasPrefix(row.RefreshToken, "tg1:k2:") {
			t.Errorf("%s not resealed with k2: %.10s… %.10s…", row.Name, row.AccessToken, row.RefreshToken)
		}
	}
}

// checkResealChangedNoToken: the reseal itself changed no token and
// bumped no version of the connections nobody refreshed.
func checkResealChangedNoToken(t *testing.T, r *repository.TokenRepository, names, hot []string, versions map[string]int64) {
	t.Helper()
	for _, name := range names {
		if isHot(name, hot) {
			continue
		}
		tok, err := r.Get(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		if tok.Version != versions[name] || tok.RefreshToken.Reveal() != "rt-"+name || tok.AccessToken.Reveal() != "at-"+name {
			t.Errorf("%s changed by reseal: version %d (was %d)", name, tok.Version, versions[name])
		}
	}
}

func isHot(name string, hot []string) bool {
	for _, h := range hot {
		if h == name {
			return true
		}
	}
	return false
}

func TestResealWaitsForARefreshInProgress(t *testing.T) {
	_, db, url := newRepo(t)
	ctx := context.Background()
	k1 := repository.NewTokenRepository(db, keyring(t, "k1="+testKey1))
	put(t, k1, grantToken("acme", "at-1", "rt-1"))
	ring := keyring(t, "k2="+testKey2+"*,k1="+testKey1)
	r := repository.NewTokenRepository(db, ring)
	other := repository.NewTokenRepository(open(t, url), ring)

	// A refresh's Store waits for the lock (held by another
	// transaction), and the reseal waits behind it: the lock's queue is
	// served in order.
	release := holdLock(t, other, "acme", func(context.Context, usecase.LockedStore) error { return nil })
	cur, err := other.Get(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := other.Store(ctx, cur.Rotated(domain.Grant{AccessToken: domain.NewSecret("at-2"), RefreshToken: domain.NewSecret("rt-2")}, time.Now()))
		done <- err
	}()
	waitForLockWaiters(t, db, 1)
	resealed := make(chan error, 1)
	go func() {
		_, err := r.Reseal(ctx, 0, 5*time.Second)
		resealed <- err
	}()
	waitForLockWaiters(t, db, 2)
	select {
	case err := <-resealed:
		t.Fatalf("reseal finished while a refresh waited for the lock: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-resealed; err != nil {
		t.Fatal(err)
	}
	tok, err := r.Get(ctx, "acme")
	if err != nil || tok.RefreshToken.Reveal() != "rt-2" || tok.Version != 2 {
		t.Fatalf("after refresh and reseal: rt %q version %d, %v", tok.RefreshToken.Reveal(), tok.Version, err)
	}
}

func TestCheckKeysFailsOnAMissingKey(t *testing.T) {
	plain, db, _ := newRepo(t)
	ctx := context.Background()
	put(t, plain, grantToken("legacy", "at-l", "rt-l"))
	k1 := repository.NewTokenRepository(db, keyring(t, "k1="+testKey1))
	put(t, k1, grantToken("acme", "at-1", "rt-1"))

	if kc, err := k1.CheckKeys(ctx); err != nil || kc.Stale != 1 {
		t.Errorf("CheckKeys with k1 = %+v, %v; want 1 legacy", kc, err)
	}
	both := repository.NewTokenRepository(db, keyring(t, "k2="+testKey2+"*,k1="+testKey1))
	if kc, err := both.CheckKeys(ctx); err != nil || kc.Stale != 2 {
		t.Errorf("CheckKeys with k2 current = %+v, %v; want 2 stale", kc, err)
	}
	for name, r := range map[string]*repository.TokenRepository{
		"k1 missing": repository.NewTokenRepository(db, keyring(t, "k2="+testKey2)),
		"no keys":    plain,
		"k1 wrong":   repository.NewTokenRepository(db, keyring(t, "k1="+testKey2)),
	} {
		_, err := r.CheckKeys(ctx)
		if !errors.Is(err, domain.ErrUndecryptable) || !strings.Contains(err.Error(), "acme") ||
			!strings.Contains(err.Error(), `"k1"`) {
			t.Errorf("%s: err = %v, want ErrUndecryptable naming acme and k1", name, err)
		}
	}
	if _, err := repository.NewTokenRepository(db, keyring(t, "k2="+testKey2)).Reseal(ctx, 0, time.Second); !errors.Is(err, domain.ErrUndecryptable) {
		t.Errorf("Reseal without the old key: err = %v", err)
	}
}

// The start-up key check reads the key ids in use through their index: its
// cost follows the number of key ids, not of rows.
func TestCheckKeysReadsKeyIDsThroughTheIndex(t *testing.T) {
	_, db, _ := newRepo(t)
	if err := db.Exec(`INSERT INTO tokenguard_connections (name) SELECT 'c-' || g FROM generate_series(1, 20000) g`).Error; err != nil {
		t.Fatal(err)
	}
	// 20,000 rows with the shape of k1 envelopes.
	if err := db.Exec(`INSERT INTO tokenguard_tokens (connection_id, access_token, refresh_token, obtained_at, version)
		SELECT id, 'tg1:k1:x', 'tg1:k1:x', now(), 1 FROM tokenguard_connections`).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Exec("ANALYZE tokenguard_tokens").Error; err != nil {
		t.Fatal(err)
	}
	var plan []string
	if err := db.Raw(`EXPLAIN SELECT ` + "(CASE WHEN refresh_token LIKE 'tg1:%' THEN split_part(refresh_token, ':', 2) ELSE '' END)" +
		` FROM tokenguard_tokens ORDER BY 1 LIMIT 1`).Scan(&plan).Error; err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(plan, "\n"), "tokenguard_tokens_key_id") {
		t.Errorf("key ids not read through the index:\n%s", strings.Join(plan, "\n"))
	}
}
