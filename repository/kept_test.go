package repository_test

import (
	"context"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// A rotation the database lost is written back by the process that stored
// it only over the refresh token that rotation spent: acme, found back at
// its spent token, is written back; globex, found behind its rotation but
// holding another refresh token (not one this process spent), is left as
// it is.
func TestLostRotationIsWrittenBackOnlyOverTheTokenItSpent(t *testing.T) {
	r, db, _ := newRepo(t)
	ctx := context.Background()
	written := make(chan string, 2)
	r.OnRotationWrittenBack(func(connection string, lost, found, stored int64) { written <- connection })
	for _, name := range []string{"acme", "globex"} {
		seen := put(t, r, grantToken(name, "at-1", "rt-1"))
		claimed := seen
		claimed.RefreshToken = domain.Secret{} // as the use case's cache holds it
		end, err := lease(t, r, claimed)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Store(ctx, seen.Rotated(domain.Grant{AccessToken: domain.NewSecret("at-2"), RefreshToken: domain.NewSecret("rt-2")}, time.Now())); err != nil {
			t.Fatal(err)
		}
		end(false)
	}
	// As a restore from backup leaves them: back at version 1.
	if err := db.Exec(`UPDATE tokenguard_tokens t SET version = 1, access_token = 'at-1',
    refresh_token = CASE c.name WHEN 'acme' THEN 'rt-1' ELSE 'rt-other' END
FROM tokenguard_connections c WHERE c.id = t.connection_id`).Error; err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-written:
		if c != "acme" {
			t.Fatalf("%s written back, want acme", c)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("acme's lost rotation was never written back")
	}
	time.Sleep(time.Second) // more of the renewer's ticks: globex stays as it is
	for name, want := range map[string]string{"acme": "rt-2", "globex": "rt-other"} {
		tok, err := r.Get(ctx, name)
		if err != nil || tok.RefreshToken.Reveal() != want {
			t.Errorf("%s holds %q (%v), want %q", name, tok.RefreshToken.Reveal(), err, want)
		}
	}
	if len(written) != 0 {
		t.Errorf("%s written back too, want acme only", <-written)
	}
}
