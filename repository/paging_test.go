package repository_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/repository"
)

// seedRows stores n connections c-00000.. straight in SQL: every tenth
// needs reauthorisation, every seventh has no expiry, and expiries repeat
// (300 distinct values), so that paging must break ties.
func seedRows(t *testing.T, db *gorm.DB, n int, base time.Time) {
	t.Helper()
	err := db.Exec(`
WITH c AS (
    INSERT INTO tokenguard_connections (name) SELECT format('c-%s', lpad(i::text, 5, '0')) FROM generate_series(0, ? - 1) i
    RETURNING id, name
)
INSERT INTO tokenguard_tokens (connection_id, access_token, refresh_token, expiry, obtained_at, version, status)
SELECT c.id, 'at-' || c.name, 'rt-' || c.name,
       CASE WHEN i % 7 = 3 THEN NULL ELSE ?::timestamptz + ((i * 37) % 300) * interval '1 second' END,
       now(), 1, CASE WHEN i % 10 = 4 THEN 'needs_reauth' ELSE 'active' END
FROM c, LATERAL (SELECT substr(c.name, 3)::int AS i) x`, n, base).Error
	if err != nil {
		t.Fatal(err)
	}
}

func TestEachPagesThroughEveryRowInNameOrder(t *testing.T) {
	r, db, _ := newRepo(t)
	const n = 2*repository.DefaultPage + 17
	seedRows(t, db, n, time.Now())
	var names []string
	err := r.Each(context.Background(), func(tok domain.Token) error {
		if tok.RefreshToken.Reveal() != "rt-"+tok.Connection {
			t.Fatalf("%s: refresh token not its own", tok.Connection)
		}
		names = append(names, tok.Connection)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != n || !slices.IsSorted(names) || len(slices.Compact(slices.Clone(names))) != n {
		t.Fatalf("Each saw %d rows (sorted %v), want %d distinct in order", len(names), slices.IsSorted(names), n)
	}
	// fn's error stops the walk.
	stop := fmt.Errorf("enough")
	seen := 0
	if err := r.Each(context.Background(), func(domain.Token) error { seen++; return stop }); err != stop || seen != 1 {
		t.Errorf("Each after an error: seen %d, err %v", seen, err)
	}
}

func TestExpiringBeforePagesByExpiryWithTies(t *testing.T) {
	r, db, _ := newRepo(t)
	const n = 1000
	base := time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond)
	seedRows(t, db, n, base)
	deadline := base.Add(150 * time.Second) // about half the expiries
	ctx := context.Background()

	var want []string
	err := db.Raw(`SELECT c.name FROM tokenguard_tokens t JOIN tokenguard_connections c ON c.id = t.connection_id
		WHERE t.status = 'active' AND t.expiry < ? ORDER BY t.expiry, t.connection_id`, deadline).Find(&want).Error
	if err != nil || len(want) < 300 {
		t.Fatalf("control query: %d rows, %v", len(want), err)
	}
	var got []string
	pages := 0
	for after := ""; ; pages++ {
		due, next, err := r.ExpiringBefore(ctx, deadline, after, 64)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, connections(due)...)
		if next == "" {
			break
		}
		after = next
	}
	if !slices.Equal(got, want) {
		t.Fatalf("paged %d names over %d pages, want the %d of one ordered query", len(got), pages, len(want))
	}
	// The keep-alive sweep's listing: every active row has the same
	// obtained_at, so the order is the connection id's alone.
	var wantIdle []string
	if err := db.Raw(`SELECT c.name FROM tokenguard_tokens t JOIN tokenguard_connections c ON c.id = t.connection_id
		WHERE t.status = 'active' ORDER BY t.connection_id`).Find(&wantIdle).Error; err != nil {
		t.Fatal(err)
	}
	var idle []string
	for after := ""; ; {
		due, next, err := r.ObtainedBefore(ctx, time.Now().Add(time.Minute), after, 100)
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, connections(due)...)
		if next == "" {
			break
		}
		after = next
	}
	if !slices.Equal(idle, wantIdle) {
		t.Fatalf("ObtainedBefore paged %d names, want %d", len(idle), len(wantIdle))
	}
	if _, _, err := r.ExpiringBefore(ctx, deadline, "garbage", 10); err == nil {
		t.Error("a malformed cursor was accepted")
	}
}

func connections(toks []domain.Token) []string {
	names := make([]string, len(toks))
	for i, tok := range toks {
		names[i] = tok.Connection
	}
	return names
}

// The sweep claims a token as listed: the listing carries what Claim
// compares (the version and the failure record) and what the sweep checks
// before it (status, expiry), and no credentials.
func TestExpiringBeforeListsWhatAClaimCompares(t *testing.T) {
	r, db, _ := newRepo(t)
	base := time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond)
	seedRows(t, db, 3, base)
	err := db.Exec(`UPDATE tokenguard_tokens SET version = 7 WHERE connection_id = (SELECT id FROM tokenguard_connections WHERE name = 'c-00001')`).Error
	if err == nil {
		err = db.Exec(`INSERT INTO tokenguard_refresh_failures (connection_id, version, failures, since, last_at, retry_at, http_status, code)
			SELECT id, 7, 2, now(), now(), now() + interval '1 minute', 503, 'unavailable' FROM tokenguard_connections WHERE name = 'c-00001'`).Error
	}
	if err != nil {
		t.Fatal(err)
	}
	due, _, err := r.ExpiringBefore(context.Background(), base.Add(time.Hour), "", 10)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(due, func(tok domain.Token) bool { return tok.Connection == "c-00001" })
	if i < 0 {
		t.Fatalf("c-00001 not listed: %v", connections(due))
	}
	got, want := due[i], domain.RefreshFailure{Failures: 2, HTTPStatus: 503, Code: "unavailable"}
	if got.Version != 7 || got.Status != domain.StatusActive || got.Expiry.IsZero() ||
		got.Failure.Failures != want.Failures || got.Failure.HTTPStatus != want.HTTPStatus || got.Failure.Code != want.Code || got.Failure.RetryAt.IsZero() {
		t.Errorf("listed %+v, want version 7 with its failure record %+v", got, want)
	}
	for _, tok := range due {
		if !tok.AccessToken.IsZero() || !tok.RefreshToken.IsZero() {
			t.Errorf("%s listed with its credentials", tok.Connection)
		}
	}
}

// The sweep's page is a range scan of tokens_active_expiry (migration 6)
// once the planner may not read the whole table instead (on a table this
// small it would).
func TestExpiringBeforeUsesTheExpiryIndex(t *testing.T) {
	_, db, _ := newRepo(t)
	seedRows(t, db, 1000, time.Now())
	var plan []string
	err := db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec("SET LOCAL enable_seqscan = off").Error; err != nil {
			return err
		}
		return tx.Raw(`EXPLAIN SELECT c.name, t.expiry, t.connection_id FROM tokenguard_tokens t JOIN tokenguard_connections c ON c.id = t.connection_id
			WHERE t.status = 'active' AND t.expiry < now() + interval '1 minute' AND (t.expiry, t.connection_id) > (now(), 5)
			ORDER BY t.expiry, t.connection_id LIMIT 500`).Find(&plan).Error
	})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(plan, "\n"), "tokens_active_expiry") {
		t.Fatalf("plan does not use tokens_active_expiry:\n%s", strings.Join(plan, "\n"))
	}
	err = db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec("SET LOCAL enable_seqscan = off").Error; err != nil {
			return err
		}
		return tx.Raw(`EXPLAIN SELECT c.name FROM tokenguard_tokens t JOIN tokenguard_connections c ON c.id = t.connection_id
			WHERE t.status = 'active' AND t.obtained_at < now() - interval '1 day' AND (t.obtained_at, t.connection_id) > (now() - interval '2 days', 5)
			ORDER BY t.obtained_at, t.connection_id LIMIT 500`).Find(&plan).Error
	})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(plan, "\n"), "tokens_active_obtained") {
		t.Fatalf("plan does not use tokens_active_obtained:\n%s", strings.Join(plan, "\n"))
	}
}

// A sweep whose window is longer than the tokens' lifetime meets every
// token it refreshes again further on in expiry order; the walk leaves out
// tokens obtained after it began, so it visits each connection once and
// ends.
func TestExpiringBeforeNeverRevisitsATokenRefreshedDuringTheWalk(t *testing.T) {
	r, db, _ := newRepo(t)
	const n = 300
	base := time.Now().Add(time.Minute).UTC().Truncate(time.Microsecond)
	seedRows(t, db, n, base)
	ctx := context.Background()
	deadline := base.Add(2 * time.Hour) // longer than the new lifetime below
	seen := map[string]int{}
	for after, pages := "", 0; ; pages++ {
		if pages > n {
			t.Fatal("the walk does not end")
		}
		due, next, err := r.ExpiringBefore(ctx, deadline, after, 16)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range connections(due) {
			seen[name]++
			// Refreshed now: a new hour of life, still inside the window.
			if err := db.Exec(`UPDATE tokenguard_tokens SET expiry = now() + interval '1 hour', obtained_at = clock_timestamp()
				WHERE connection_id = (SELECT id FROM tokenguard_connections WHERE name = ?)`, name).Error; err != nil {
				t.Fatal(err)
			}
		}
		if next == "" {
			break
		}
		after = next
	}
	for name, times := range seen {
		if times != 1 {
			t.Errorf("%s visited %d times", name, times)
		}
	}
	if len(seen) < n/2 {
		t.Errorf("visited %d connections", len(seen))
	}
}
