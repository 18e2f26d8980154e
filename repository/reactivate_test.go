package repository_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/internal/waitfor"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// markDead stores name as needs_reauth for reason, as a refresh that got
// that answer did, and returns the stored token.
func markDead(t *testing.T, r *repository.TokenRepository, name, reason string) domain.Token {
	t.Helper()
	ctx := context.Background()
	tok, err := r.Get(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	tok.Status, tok.StatusReason = domain.StatusNeedsReauth, reason
	out, err := r.Store(ctx, tok)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// storedRow is a token row's columns as stored, sealed values included.
type storedRow struct {
	AccessToken, TokenType, RefreshToken string
	Expiry, ObtainedAt                   time.Time
	Version                              int64
	Status, StatusReason                 string
}

func stored(t *testing.T, db *gorm.DB, name string) storedRow {
	t.Helper()
	var row storedRow
	err := db.Raw(`SELECT t.access_token, t.token_type, t.refresh_token, t.expiry, t.obtained_at, t.version, t.status, t.status_reason
		FROM tokenguard_tokens t JOIN tokenguard_connections c ON c.id = t.connection_id WHERE c.name = ?`, name).Scan(&row).Error
	if err != nil {
		t.Fatal(err)
	}
	return row
}

// changes records what a change listener (another process's cache) hears.
type changes struct {
	mu      sync.Mutex
	heard   map[string]int64
	trusted chan struct{}
	once    sync.Once
}

func (c *changes) Invalidate(id string, version int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.heard[id] = max(c.heard[id], version)
}

func (c *changes) TrustCache(trusted bool) {
	if trusted {
		c.once.Do(func() { close(c.trusted) })
	}
}

func listen(t *testing.T, url string) *changes {
	t.Helper()
	c := &changes{heard: map[string]int64{}, trusted: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = repository.NewChangeListener(url, c, nil).Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-c.trusted:
	case <-time.After(10 * time.Second):
		t.Fatal("listener never connected")
	}
	return c
}

// waitHeard waits until the listener heard name at version.
func (c *changes) waitHeard(t *testing.T, name string, version int64) {
	t.Helper()
	waitfor.Until(t, 5*time.Second, fmt.Sprintf("the other process never heard %s at version %d", name, version), func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.heard[name] >= version
	})
}

func TestReactivate(t *testing.T) {
	_, db, url := newRepo(t)
	// Sealed: the tokens stay as they are, sealed again bound to the new
	// version (new envelopes that open to the same tokens).
	r := repository.NewTokenRepository(db, keyring(t, "k1="+testKey1+"*"))
	ctx := context.Background()
	for _, name := range []string{"client-dead", "grant-dead", "alive"} {
		put(t, r, grantToken(name, "at-"+name, "rt-"+name))
	}
	markDead(t, r, "client-dead", "invalid_client")
	markDead(t, r, "grant-dead", "invalid_grant")
	before := stored(t, db, "client-dead")
	untouched := map[string]storedRow{"grant-dead": stored(t, db, "grant-dead"), "alive": stored(t, db, "alive")}
	other := listen(t, url)

	found, version, err := r.Reactivate(ctx, "client-dead", "", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if found.Status != domain.StatusNeedsReauth || found.StatusReason != "invalid_client" || found.Version != before.Version || version != before.Version+1 {
		t.Errorf("found %v (reason %q), version %d; want needs_reauth invalid_client at %d, written at %d",
			found, found.StatusReason, version, before.Version, before.Version+1)
	}
	after := stored(t, db, "client-dead")
	want := before
	want.Version, want.Status, want.StatusReason = before.Version+1, "active", ""
	if after.AccessToken == before.AccessToken || after.RefreshToken == before.RefreshToken {
		t.Error("the credentials were not sealed again for the new version")
	}
	want.AccessToken, want.RefreshToken = after.AccessToken, after.RefreshToken
	if after != want {
		t.Errorf("stored after reactivation:\n%+v\nwant\n%+v", after, want)
	}
	tok, err := r.Get(ctx, "client-dead")
	if err != nil || tok.AccessToken.Reveal() != "at-client-dead" || tok.RefreshToken.Reveal() != "rt-client-dead" || tok.Status != domain.StatusActive {
		t.Errorf("Get after reactivation: %v, %v", tok, err)
	}
	other.waitHeard(t, "client-dead", version)

	// An active connection is reported as found and left alone; so is one
	// marked dead for another reason than the one asked for.
	if found, version, err := r.Reactivate(ctx, "alive", "", time.Second); err != nil || version != 0 || found.Status != domain.StatusActive {
		t.Errorf("reactivate an active connection: %v, %d, %v", found, version, err)
	}
	if found, version, err := r.Reactivate(ctx, "grant-dead", "invalid_client", time.Second); err != nil || version != 0 || found.StatusReason != "invalid_grant" {
		t.Errorf("reactivate invalid_client on an invalid_grant connection: %v, %d, %v", found, version, err)
	}
	for name, row := range untouched {
		if got := stored(t, db, name); got != row {
			t.Errorf("%s changed:\n%+v\nwas\n%+v", name, got, row)
		}
	}
	if _, _, err := r.Reactivate(ctx, "nobody", "", time.Second); !errors.Is(err, domain.ErrNotFound) {
		t.Errorf("unknown connection: err = %v, want ErrNotFound", err)
	}
	// Registered, no token yet (a connect flow in progress).
	if err := r.Register(ctx, "half"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.Reactivate(ctx, "half", "", time.Second); !errors.Is(err, domain.ErrNotFound) {
		t.Errorf("connection without a token: err = %v, want ErrNotFound", err)
	}
}

func TestReactivateWaitsForTheLockAndDecidesOnWhatItFinds(t *testing.T) {
	r, db, _ := newRepo(t)
	ctx := context.Background()
	put(t, r, grantToken("acme", "at-1", "rt-1"))
	markDead(t, r, "acme", "invalid_client")

	// A refresh that finds the grant really dead waits for the lock to
	// store that, ahead of the reactivation (the lock's queue is served in
	// order): the reactivation waits for it and then leaves the row alone.
	release := holdLock(t, r, "acme", func(context.Context, usecase.LockedStore) error { return nil })
	tok, err := r.Get(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	tok.StatusReason = "invalid_grant"
	storeDone := make(chan error, 1)
	go func() {
		_, err := r.Store(ctx, tok)
		storeDone <- err
	}()
	waitForLockWaiters(t, db, 1)
	type result struct {
		found   domain.Token
		version int64
		err     error
	}
	done := make(chan result, 1)
	go func() {
		found, version, err := r.Reactivate(ctx, "acme", "invalid_client", 5*time.Second)
		done <- result{found, version, err}
	}()
	waitForLockWaiters(t, db, 2)
	select {
	case res := <-done:
		t.Fatalf("reactivated while the lock was held: %+v", res)
	default:
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	if err := <-storeDone; err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil || res.version != 0 || res.found.StatusReason != "invalid_grant" {
		t.Errorf("after the holder: found %v (reason %q), version %d, err %v; want invalid_grant left alone",
			res.found, res.found.StatusReason, res.version, res.err)
	}
	if row := stored(t, db, "acme"); row.Status != "needs_reauth" || row.StatusReason != "invalid_grant" {
		t.Errorf("stored %+v", row)
	}

	// A lock held for longer than the wait is a typed error; nothing changes.
	markDead(t, r, "acme", "invalid_client")
	release = holdLock(t, r, "acme", func(context.Context, usecase.LockedStore) error { return nil })
	_, _, err = r.Reactivate(ctx, "acme", "", 200*time.Millisecond)
	if rerr := release(); rerr != nil {
		t.Fatal(rerr)
	}
	if !errors.Is(err, domain.ErrLockTimeout) {
		t.Errorf("held lock: err = %v, want ErrLockTimeout", err)
	}
	if row := stored(t, db, "acme"); row.Status != "needs_reauth" {
		t.Errorf("stored %+v after a lock timeout", row)
	}
}

func TestNeedingReauthPages(t *testing.T) {
	r, _, _ := newRepo(t)
	ctx := context.Background()
	var want []string
	for i := range 7 {
		name := fmt.Sprintf("client-%02d", i)
		put(t, r, grantToken(name, "at", "rt"))
		markDead(t, r, name, "invalid_client")
		want = append(want, name)
	}
	for _, name := range []string{"client-03x", "zz-active"} {
		put(t, r, grantToken(name, "at", "rt"))
	}
	markDead(t, r, "client-03x", "invalid_grant")

	var got []string
	pages := 0
	for after := ""; ; pages++ {
		page, err := r.NeedingReauth(ctx, "invalid_client", after, 3)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		if len(page) > 3 {
			t.Fatalf("page of %d", len(page))
		}
		got = append(got, page...)
		after = page[len(page)-1]
	}
	if !slices.Equal(got, want) || pages != 3 {
		t.Errorf("walked %v in %d pages, want %v in 3", got, pages, want)
	}
}
