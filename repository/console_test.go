package repository_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/internal/testdb"
	"github.com/tokenguard/tokenguard/repository"
)

// kinds is a history as "kind/outcome" lines, newest first.
func kinds(events []domain.ConnectionEvent) []string {
	out := make([]string, len(events))
	for i, e := range events {
		out[i] = e.Kind
		if e.Outcome != "" {
			out[i] += "/" + e.Outcome
		}
	}
	return out
}

// The history is written by the statements that already run: a refresh's
// write (its lease ends), a released lease, the dead grant's write, a
// reactivation, a disconnection; a refresh's duration runs from its lease.
func TestHistoryRecordsRefreshesAndChanges(t *testing.T) {
	r, db, _ := newRepo(t)
	ctx := context.Background()
	events := repository.NewConnectionEvents(db)
	tok := put(t, r, grantToken("acme", "at-1", "rt-1"))
	put(t, r, grantToken("quiet", "at-q", "rt-q"))

	// A refresh that stores its rotated token.
	end, err := lease(t, r, tok)
	if err != nil {
		t.Fatal(err)
	}
	rotated := tok.Rotated(domain.Grant{AccessToken: domain.NewSecret("at-2"), RefreshToken: domain.NewSecret("rt-2"), Expiry: time.Now().Add(time.Hour)}, time.Now())
	saved, err := r.Store(ctx, rotated)
	if err != nil {
		t.Fatal(err)
	}
	end(false)
	// One whose provider call failed: the lease is released, nothing stored.
	end, err = lease(t, r, saved)
	if err != nil {
		t.Fatal(err)
	}
	end(true)
	// One that finds the grant dead.
	if end, err = lease(t, r, saved); err != nil {
		t.Fatal(err)
	}
	dead := markDead(t, r, "acme", "invalid_grant")
	end(false)
	if _, _, err := r.Reactivate(ctx, "acme", "", time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Disconnect(ctx, "acme", time.Second, nil); err != nil {
		t.Fatal(err)
	}

	got, err := events.Recent(ctx, "acme", 100)
	if err != nil {
		t.Fatal(err)
	}
	k := kinds(got)
	// The dead grant's write records the refresh and the webhook's event
	// in one statement, in either order.
	if len(k) == 7 {
		slices.Sort(k[2:4])
	}
	want := []string{"disconnected", "recovered", "needs_reauth", "refresh/needs_reauth", "refresh/not_stored", "refresh/ok", "connected"}
	if !slices.Equal(k, want) {
		t.Fatalf("acme's history, newest first:\n%v\nwant\n%v", k, want)
	}
	for _, e := range got {
		switch {
		case e.Kind == "refresh" && e.Outcome == "ok" && e.Version != saved.Version,
			e.Kind == "refresh" && e.Outcome == "needs_reauth" && (e.Reason != "invalid_grant" || e.Version != dead.Version),
			e.Kind == "needs_reauth" && e.Reason != "invalid_grant":
			t.Errorf("event %+v", e)
		case e.Kind == "refresh" && e.Duration < 0, e.Kind != "refresh" && e.Duration != 0:
			t.Errorf("duration of %+v", e)
		}
	}
	if q, err := events.Recent(ctx, "quiet", 100); err != nil || !slices.Equal(kinds(q), []string{"connected"}) {
		t.Errorf("quiet's history: %v, %v", kinds(q), err)
	}
	last, err := events.LastRefreshes(ctx, []string{"acme", "quiet", "nobody"})
	if err != nil || len(last) != 1 || last["acme"].Outcome != "needs_reauth" {
		t.Errorf("last refreshes: %+v, %v", last, err)
	}
	rates, err := events.RefreshRates(ctx, time.Now().Add(-time.Hour))
	if err != nil || rates[""] != (domain.RefreshRate{Provider: "", OK: 1, Total: 3}) {
		t.Errorf("refresh rates: %+v, %v", rates, err)
	}
	if rates, err := events.RefreshRates(ctx, time.Now().Add(time.Hour)); err != nil || len(rates) != 0 {
		t.Errorf("refresh rates from an hour ahead: %+v, %v", rates, err)
	}
}

// The pruner keeps the last 100 events of each connection and none older
// than 30 days; the control counts what was there before.
func TestEventPrunerBoundsTheHistory(t *testing.T) {
	_, db, _ := newRepo(t)
	ctx := context.Background()
	insert := func(connection string, n int, age time.Duration) {
		t.Helper()
		err := db.Exec(`INSERT INTO tokenguard_connection_events (connection, kind, occurred_at)
SELECT ?, 'refresh', now() - ? * interval '1 second' FROM generate_series(1, ?)`, connection, int64(age/time.Second), n).Error
		if err != nil {
			t.Fatal(err)
		}
	}
	count := func(connection string) (n int64) {
		t.Helper()
		if err := db.Raw("SELECT count(*) FROM tokenguard_connection_events WHERE connection = ?", connection).Scan(&n).Error; err != nil {
			t.Fatal(err)
		}
		return n
	}
	insert("busy", 30, time.Hour)
	insert("busy", 100, 0)
	insert("calm", 5, 0)
	insert("gone", 3, 31*24*time.Hour)
	if c := count("busy") + count("calm") + count("gone"); c != 138 {
		t.Fatalf("control: %d rows before pruning", c)
	}
	p := repository.NewEventPruner(db)
	deleted, err := p.Prune(ctx)
	if err != nil || deleted != 33 {
		t.Errorf("first round deleted %d, %v; want 33", deleted, err)
	}
	var oldest int64
	if err := db.Raw("SELECT count(*) FROM tokenguard_connection_events WHERE connection = 'busy' AND occurred_at < now() - interval '1 minute'").Scan(&oldest).Error; err != nil || oldest != 0 {
		t.Errorf("busy kept %d of its oldest events, %v", oldest, err)
	}
	if count("busy") != 100 || count("calm") != 5 || count("gone") != 0 {
		t.Errorf("after pruning: busy %d, calm %d, gone %d; want 100, 5, 0", count("busy"), count("calm"), count("gone"))
	}
	// A later round looks only at connections written to since.
	insert("busy", 2, 0)
	if deleted, err := p.Prune(ctx); err != nil || deleted != 2 || count("busy") != 100 {
		t.Errorf("second round deleted %d, %v; busy has %d", deleted, err, count("busy"))
	}
	if deleted, err := p.Prune(ctx); err != nil || deleted != 0 {
		t.Errorf("an idle round deleted %d, %v", deleted, err)
	}
}

func TestConsoleSessions(t *testing.T) {
	_, db, _ := newRepo(t)
	ctx := context.Background()
	keys := repository.NewAPIKeys(db)
	for _, name := range []string{"ops", "other"} {
		if _, err := keys.Create(ctx, name, domain.KeyAccess{}); err != nil {
			t.Fatal(err)
		}
	}
	list, err := keys.List(ctx)
	if err != nil || len(list) != 2 {
		t.Fatal(list, err)
	}
	ops, other := list[0], list[1]
	sessions := repository.NewConsoleSessions(db)
	token, expires, err := sessions.Create(ctx, ops.ID, time.Hour)
	if err != nil || !strings.HasPrefix(token.Reveal(), "tgc_") || time.Until(expires) < 59*time.Minute {
		t.Fatalf("create: %v, %v, %v", token, expires, err)
	}
	s, err := sessions.Lookup(ctx, token)
	if err != nil || s.ID != ops.ID || s.Name != "ops" {
		t.Errorf("lookup: %+v, %v", s, err)
	}
	// The session carries its key's rights as they are now: every right
	// here (NULL scopes and patterns), a tenant's patterns below.
	if s.Scopes != nil || s.Connections != nil {
		t.Errorf("lookup of a key of every right: access %+v", s)
	}
	tenant := domain.KeyAccess{Scopes: []domain.Scope{domain.ScopeAdmin}, Connections: []string{"tenant-a-*"}}
	if _, err := keys.Create(ctx, "tenant", tenant); err != nil {
		t.Fatal(err)
	}
	all, _ := keys.List(ctx)
	tk, _, _ := sessions.Create(ctx, all[len(all)-1].ID, time.Hour)
	if ts, err := sessions.Lookup(ctx, tk); err != nil || ts.Name != "tenant" || !ts.Has(domain.ScopeAdmin) ||
		ts.Has(domain.ScopeTokenRead) || !ts.AllowsConnection("tenant-a-1") || ts.AllowsConnection("tenant-b-2") {
		t.Errorf("lookup of a tenant's session: %+v, %v", ts, err)
	}
	// Only the hash is stored.
	var stored int
	if err := db.Raw("SELECT count(*) FROM tokenguard_console_sessions WHERE position(convert_to(?, 'UTF8') IN token_hash) > 0", token.Reveal()).Scan(&stored).Error; err != nil || stored != 0 {
		t.Errorf("the token is stored as it is: %d, %v", stored, err)
	}
	unauthorized := func(what string, tok domain.Secret) {
		t.Helper()
		if _, err := sessions.Lookup(ctx, tok); !errors.Is(err, domain.ErrUnauthorized) {
			t.Errorf("%s: %v, want ErrUnauthorized", what, err)
		}
	}
	unauthorized("an unknown token", domain.NewCredential(domain.ConsolePrefix))
	// Logout.
	if err := sessions.Delete(ctx, token); err != nil {
		t.Fatal(err)
	}
	unauthorized("a logged-out token", token)
	// Expiry.
	old, _, err := sessions.Create(ctx, ops.ID, -time.Second)
	if err != nil {
		t.Fatal(err)
	}
	unauthorized("an expired token", old)
	// Revoking the key ends its sessions, and only its.
	mine, _, _ := sessions.Create(ctx, ops.ID, time.Hour)
	theirs, _, _ := sessions.Create(ctx, other.ID, time.Hour)
	if err := keys.Revoke(ctx, "ops"); err != nil {
		t.Fatal(err)
	}
	unauthorized("a session of a revoked key", mine)
	if s, err := sessions.Lookup(ctx, theirs); err != nil || s.Name != "other" {
		t.Errorf("another key's session after the revocation: %+v, %v", s, err)
	}
}

func TestFilteredConnectionsPage(t *testing.T) {
	r, db, _ := newRepo(t)
	ctx := context.Background()
	if err := db.Exec("INSERT INTO tokenguard_providers (name, token_url, client_id) VALUES ('crm', 'http://crm.example/token', 'c')").Error; err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		tok := grantToken(fmt.Sprintf("team-%d", i), "at", "rt")
		if i%2 == 1 {
			tok.Provider = "crm"
		}
		if i == 4 {
			tok.RefreshExpiry = time.Now().Add(24 * time.Hour)
		}
		put(t, r, tok)
	}
	put(t, r, grantToken("solo", "at", "rt"))
	markDead(t, r, "team-2", "invalid_grant")
	if err := db.Exec("UPDATE tokenguard_connections SET tags = '{eu,billing}' WHERE name IN ('team-0', 'solo')").Error; err != nil {
		t.Fatal(err)
	}
	names := func(f domain.ConnectionFilter, after string, limit int) string {
		t.Helper()
		page, err := r.FilteredConnectionsPage(ctx, f, after, limit)
		if err != nil {
			t.Fatal(err)
		}
		out := make([]string, len(page))
		for i, c := range page {
			out[i] = c.Name
		}
		return strings.Join(out, ",")
	}
	for _, c := range []struct {
		f     domain.ConnectionFilter
		after string
		limit int
		want  string
	}{
		{domain.ConnectionFilter{}, "", 10, "solo,team-0,team-1,team-2,team-3,team-4"},
		{domain.ConnectionFilter{Status: domain.StatusNeedsReauth}, "", 10, "team-2"},
		{domain.ConnectionFilter{Status: domain.StatusActive}, "", 10, "solo,team-0,team-1,team-3,team-4"},
		{domain.ConnectionFilter{Status: "failing"}, "", 10, ""},
		{domain.ConnectionFilter{Status: domain.StatusExpiringSoon}, "", 10, "team-4"},
		{domain.ConnectionFilter{Provider: "crm"}, "", 10, "team-1,team-3"},
		{domain.ConnectionFilter{Provider: domain.EnvProvider}, "", 10, "solo,team-0,team-2,team-4"},
		{domain.ConnectionFilter{Tag: "eu"}, "", 10, "solo,team-0"},
		{domain.ConnectionFilter{Tag: "e"}, "", 10, ""},
		{domain.ConnectionFilter{NamePrefix: "team-"}, "", 2, "team-0,team-1"},
		{domain.ConnectionFilter{NamePrefix: "team-"}, "team-1", 2, "team-2,team-3"},
		{domain.ConnectionFilter{NamePrefix: "team-", Provider: domain.EnvProvider, Status: domain.StatusActive}, "team-0", 10, "team-4"},
		{domain.ConnectionFilter{NamePrefix: "so"}, "", 10, "solo"},
		{domain.ConnectionFilter{NamePrefix: "%"}, "", 10, ""},
	} {
		if got := names(c.f, c.after, c.limit); got != c.want {
			t.Errorf("%+v after %q limit %d: %q, want %q", c.f, c.after, c.limit, got, c.want)
		}
	}
}

// BenchmarkRefreshWrites: the database side of one refresh (the lock
// with the re-read and the lease, committed; then the rotated token
// written and the lease ended, committed), in a database with the
// history's triggers and, as the control, in one without them,
// alternately, so that both see the same machine. It reports the median
// and p90 of each in ms.
func BenchmarkRefreshWrites(b *testing.B) {
	if testing.Short() {
		b.Skip("needs Postgres")
	}
	type side struct {
		r     *repository.TokenRepository
		db    *gorm.DB
		cur   domain.Token
		times []time.Duration
	}
	ctx := context.Background()
	g := domain.Grant{AccessToken: domain.NewSecret("at2"), RefreshToken: domain.NewSecret("rt2"), Expiry: time.Now().Add(time.Hour)}
	sides := make([]*side, 2) // 0: with the history, 1: without
	for i := range sides {
		db := open(b, testdb.New(b))
		if i == 1 {
			if err := db.Exec("DROP TRIGGER tokenguard_refresh_leases_event ON tokenguard_refresh_leases; DROP TRIGGER tokenguard_webhook_outbox_event ON tokenguard_webhook_outbox").Error; err != nil {
				b.Fatal(err)
			}
		}
		r := repository.NewTokenRepository(db, tokencrypt.Plaintext{})
		sides[i] = &side{r: r, db: db, cur: put(b, r, grantToken("acme", "at", "rt"))}
	}
	refresh := func(s *side) {
		start := time.Now()
		c, err := s.r.Claim(ctx, s.cur, time.Second)
		if err != nil || c.End == nil {
			b.Fatalf("claim: lease %t, %v", c.End != nil, err)
		}
		if s.cur, err = s.r.Store(ctx, c.Token.Rotated(g, time.Now())); err != nil {
			b.Fatal(err)
		}
		c.End(false)
		s.times = append(s.times, time.Since(start))
	}
	for b.Loop() {
		refresh(sides[0])
		refresh(sides[1])
	}
	b.StopTimer()
	for i, s := range sides {
		var n int64
		if err := s.db.Raw("SELECT count(*) FROM tokenguard_connection_events WHERE kind = 'refresh'").Scan(&n).Error; err != nil {
			b.Fatal(err)
		}
		if (i == 0) != (n > 0) {
			b.Fatalf("side %d: %d refreshes recorded", i, n)
		}
		slices.Sort(s.times)
		name := []string{"history", "without"}[i]
		b.ReportMetric(float64(s.times[len(s.times)/2].Microseconds())/1000, name+"-p50-ms")
		b.ReportMetric(float64(s.times[len(s.times)*9/10].Microseconds())/1000, name+"-p90-ms")
	}
}

// A refresh that stored nothing names why in the history: the reason the
// process noted (Claim.Why), given to the trigger by the statement that
// ends the lease (a release, or Fail); without one, the failure episode
// the same statement recorded (as a process of an earlier release writes
// it); without either (a bare release by such a process), nothing, which
// the console shows as not recorded.
func TestHistoryNamesWhyARefreshStoredNothing(t *testing.T) {
	r, db, _ := newRepo(t)
	ctx := context.Background()
	events := repository.NewConnectionEvents(db)
	tok := put(t, r, grantToken("acme", "at-1", "rt-1"))
	last := func() domain.ConnectionEvent {
		t.Helper()
		got, err := events.Recent(ctx, "acme", 1)
		if err != nil || len(got) != 1 {
			t.Fatalf("history: %v, %v", got, err)
		}
		return got[0]
	}

	// Released with a reason noted.
	c, err := r.Claim(ctx, tok, 0)
	if err != nil || c.End == nil || c.Why == nil {
		t.Fatalf("claim: %+v, %v", c, err)
	}
	c.Why("not stored: provider unavailable (HTTP 503 no code)")
	c.End(true)
	if e := last(); e.Outcome != "not_stored" || e.Reason != "not stored: provider unavailable (HTTP 503 no code)" {
		t.Errorf("released lease: %+v", e)
	}

	// A failure recorded with a reason noted: the reason.
	if c, err = r.Claim(ctx, tok, 0); err != nil || c.End == nil {
		t.Fatalf("claim: %+v, %v", c, err)
	}
	c.Why("timeout: no answer within 30s; the answer is lost")
	f := domain.RefreshFailure{Failures: 1, Since: time.Now(), LastAt: time.Now(), RetryAt: time.Now(), Code: domain.CodeAnswerLost}
	if err := r.Fail(ctx, tok, f); err != nil {
		t.Fatal(err)
	}
	c.End(false)
	if e := last(); e.Outcome != "not_stored" || e.Reason != "timeout: no answer within 30s; the answer is lost" {
		t.Errorf("failure with a reason: %+v", e)
	}

	// A failure recorded with none (a process of an earlier release): the
	// episode's status and code.
	tok.Failure = f
	if c, err = r.Claim(ctx, tok, 0); err != nil || c.End == nil {
		t.Fatalf("claim: %+v, %v", c, err)
	}
	f = domain.RefreshFailure{Failures: 2, Since: f.Since, LastAt: time.Now(), RetryAt: time.Now(), HTTPStatus: 418, Code: "teapot"}
	if err := r.Fail(ctx, tok, f); err != nil {
		t.Fatal(err)
	}
	c.End(false)
	if e := last(); e.Outcome != "not_stored" || e.Reason != "unclassified answer: HTTP 418 teapot (2 in a row)" {
		t.Errorf("failure without a reason: %+v", e)
	}

	// A bare release, the failure episode recorded earlier: not its reason.
	tok.Failure = f
	if c, err = r.Claim(ctx, tok, 0); err != nil || c.End == nil {
		t.Fatalf("claim: %+v, %v", c, err)
	}
	c.End(true)
	if e := last(); e.Outcome != "not_stored" || e.Reason != "" {
		t.Errorf("bare release: %+v", e)
	}
}
