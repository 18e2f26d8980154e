package repository_test

import (
	"context"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/repository"
)

// The refresh token's expiry goes through every write (Put, Save) and
// every read (Get, List, the re-read that comes with the lock, a write's
// result); zero is stored as NULL and reads back as zero.
func TestRefreshExpiryRoundTrip(t *testing.T) {
	r, db, _ := newRepo(t)
	ctx := context.Background()
	check := func(what string, got domain.Token, want time.Time) {
		t.Helper()
		if !got.RefreshExpiry.Equal(want) {
			t.Errorf("%s: refresh expiry %v, want %v", what, got.RefreshExpiry, want)
		}
	}
	reads := func(want time.Time) {
		t.Helper()
		got, err := r.Get(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		check("Get", got, want)
		all, err := r.List(ctx)
		if err != nil || len(all) != 1 {
			t.Fatalf("List = %v, %v", all, err)
		}
		check("List", all[0], want)
	}
	save := func(tok domain.Token) (locked, saved domain.Token) {
		t.Helper()
		var err error
		if locked, err = r.Get(ctx, "acme"); err != nil {
			t.Fatal(err)
		}
		tok.Version = locked.Version
		if saved, err = r.Store(ctx, tok); err != nil {
			t.Fatal(err)
		}
		return locked, saved
	}

	known := time.Now().Add(90 * 24 * time.Hour).UTC().Truncate(time.Microsecond)
	tok := grantToken("acme", "at-1", "rt-1")
	tok.RefreshExpiry = known
	check("Put", put(t, r, tok), known)
	reads(known)

	// A refresh that names no new expiry and keeps the refresh token keeps it.
	locked, _ := save(tok)
	check("re-read in the lock", locked, known)
	kept := locked.Rotated(domain.Grant{AccessToken: domain.NewSecret("at-2")}, time.Now())
	_, saved := save(kept)
	check("Save, refresh token kept", saved, known)
	reads(known)

	// A rotated refresh token without a named expiry stores unknown (NULL).
	_, saved = save(saved.Rotated(domain.Grant{AccessToken: domain.NewSecret("at-3"), RefreshToken: domain.NewSecret("rt-3")}, time.Now()))
	check("Save, rotated", saved, time.Time{})
	reads(time.Time{})
	var null bool
	if err := db.Raw("SELECT refresh_expiry IS NULL FROM tokenguard_tokens").Scan(&null).Error; err != nil || !null {
		t.Errorf("unknown refresh expiry stored as %v (err %v), want NULL", !null, err)
	}

	// A named one is stored; a new grant without one replaces it.
	later := known.Add(time.Hour)
	_, saved = save(saved.Rotated(domain.Grant{AccessToken: domain.NewSecret("at-4"), RefreshToken: domain.NewSecret("rt-4"), RefreshExpiry: later}, time.Now()))
	check("Save, named", saved, later)
	check("regrant", put(t, r, grantToken("acme", "at-5", "rt-5")), time.Time{})
	reads(time.Time{})
}

// A row written by a process that does not know the column (a rolling
// deploy) reads as unknown.
func TestRefreshExpiryOfRowsWrittenWithoutIt(t *testing.T) {
	r, db, _ := newRepo(t)
	ctx := context.Background()
	if err := r.Register(ctx, "old"); err != nil {
		t.Fatal(err)
	}
	err := db.Exec(`INSERT INTO tokenguard_tokens (connection_id, access_token, refresh_token, expiry, obtained_at, version)
SELECT id, 'at', 'rt', now() + interval '1 hour', now(), 1 FROM tokenguard_connections WHERE name = 'old'`).Error
	if err != nil {
		t.Fatal(err)
	}
	got, err := r.Get(ctx, "old")
	if err != nil || !got.RefreshExpiry.IsZero() || got.RefreshToken.Reveal() != "rt" {
		t.Errorf("Get = %+v, %v", got, err)
	}
}

func TestAuthStyles(t *testing.T) {
	_, db, _ := newRepo(t)
	ctx := context.Background()
	s := repository.NewAuthStyles(db)
	if got, err := s.Load(ctx, "https://p/token", "c"); err != nil || got != "" {
		t.Fatalf("nothing stored: Load = %q, %v", got, err)
	}
	for _, style := range []string{"params", "header"} {
		if err := s.Save(ctx, "https://p/token", "c", style); err != nil {
			t.Fatal(err)
		}
		if got, err := s.Load(ctx, "https://p/token", "c"); err != nil || got != style {
			t.Errorf("Load = %q, %v; want %q", got, err, style)
		}
	}
	// Per token URL and client id.
	if got, _ := s.Load(ctx, "https://p/token", "other"); got != "" {
		t.Errorf("another client sees %q", got)
	}
	if got, _ := s.Load(ctx, "https://q/token", "c"); got != "" {
		t.Errorf("another token URL sees %q", got)
	}
	if err := s.Save(ctx, "https://p/token", "c", "auto"); err == nil {
		t.Error("a style that is not header or params was stored")
	}
}
