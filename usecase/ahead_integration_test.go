package usecase_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/testworld"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// A swept refresh that stores nothing says why in the connection's history, as a caller's does.
func TestRefreshAheadNotesWhyARefreshStoredNothing(t *testing.T) {
	w := testworld.New(t, time.Hour)
	s := w.Stack(t, usecase.Options{})
	names := w.ConnectMany(t, s, 1)
	w.Provider.SetRefreshFault(func() sandbox.Fault { return sandbox.FaultUnavailable })
	ctx := context.Background()
	rep, err := s.UC.RefreshAhead(ctx, repository.NewTokenRepository(s.DB, tokencrypt.Plaintext{}), 2*time.Hour, 1)
	if err == nil || rep.Failed != 1 {
		t.Fatalf("sweep against a 503: %+v, %v", rep, err)
	}
	got, err := repository.NewConnectionEvents(s.DB).Recent(ctx, names[0], 1)
	if err != nil || len(got) != 1 {
		t.Fatalf("history: %v, %v", got, err)
	}
	if e := got[0]; e.Outcome != "not_stored" || !strings.HasPrefix(e.Reason, "not stored: provider unavailable (HTTP 503") {
		t.Errorf("history of the swept refresh: outcome %q, reason %q", e.Outcome, e.Reason)
	}
}

func TestRefreshAheadRefreshesDueConnectionsAndSkipsBusyOnes(t *testing.T) {
	w := testworld.New(t, time.Hour)
	s := w.Stack(t, usecase.Options{})
	other := w.Stack(t, usecase.Options{})
	names := w.ConnectMany(t, s, 20)
	ctx := context.Background()

	// Nothing expires within a minute.
	rep, err := s.UC.RefreshAhead(ctx, repository.NewTokenRepository(s.DB, tokencrypt.Plaintext{}), time.Minute, 4)
	if err != nil || rep.Due != 0 {
		t.Fatalf("window 1m: %+v, %v", rep, err)
	}

	// Another process is busy with one of them: it is skipped, not waited for.
	busy := &testworld.Stack{DB: other.DB, Repo: other.Repo}
	release := holdLeaseOn(t, busy, names[3])
	rep, err = s.UC.RefreshAhead(ctx, repository.NewTokenRepository(s.DB, tokencrypt.Plaintext{}), 2*time.Hour, 4)
	release()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("window 2h with one connection locked elsewhere: %+v", rep)
	if rep.Due != 20 || rep.Refreshed != 19 || rep.Skipped != 1 || rep.Failed != 0 {
		t.Errorf("report %+v, want 20 due, 19 refreshed, 1 skipped", rep)
	}
	st := w.Provider.Stats()
	if st.Refreshes != 19 || st.RefreshReuse != 0 {
		t.Errorf("provider saw %d refreshes and %d reuses", st.Refreshes, st.RefreshReuse)
	}
	// Every refreshed token works.
	for _, n := range names {
		tok, err := s.UC.Token(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		if code := w.CallResource(t, tok.AccessToken.Reveal()); code != http.StatusOK {
			t.Errorf("%s: resource answered %d", n, code)
		}
	}
}

func TestRefreshAheadRacesCallersWithoutReuse(t *testing.T) {
	w := testworld.New(t, 2*time.Second)
	opts := usecase.Options{Skew: 500 * time.Millisecond}
	stacks := []*testworld.Stack{w.Stack(t, opts), w.Stack(t, opts), w.Stack(t, opts)}
	names := w.ConnectMany(t, stacks[0], 10)
	time.Sleep(1600 * time.Millisecond) // all are now stale by the skew rule
	ctx := context.Background()
	var wg sync.WaitGroup
	for _, s := range stacks {
		for _, n := range names {
			wg.Go(func() {
				if _, err := s.UC.Token(ctx, n); err != nil {
					t.Error(err)
				}
			})
		}
	}
	rep, err := stacks[1].UC.RefreshAhead(ctx, repository.NewTokenRepository(stacks[1].DB, tokencrypt.Plaintext{}), time.Second, 8)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	st := w.Provider.Stats()
	t.Logf("sweep %+v; provider: %d refreshes, %d reuse", rep, st.Refreshes, st.RefreshReuse)
	if st.RefreshReuse != 0 || st.Refreshes != int64(len(names)) {
		t.Errorf("provider saw %d refreshes (want %d) and %d reuses", st.Refreshes, len(names), st.RefreshReuse)
	}
}

// holdLeaseOn claims one connection's refresh from another pool, as a
// process whose refresh of it is under way, until release.
func holdLeaseOn(t *testing.T, s *testworld.Stack, name string) (release func()) {
	t.Helper()
	ctx := context.Background()
	tok, err := s.Repo.Get(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Repo.Claim(ctx, tok, time.Minute)
	if err != nil || c.End == nil {
		t.Fatalf("claim %s: %v (taken: %t)", name, err, c.End != nil)
	}
	return func() { c.End(true) }
}

// holdLockOn keeps one connection's lock from another pool until release.
func holdLockOn(t *testing.T, s *testworld.Stack, name string) (release func()) {
	t.Helper()
	held, rel, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		done <- s.Repo.InLock(context.Background(), name, time.Second, time.Minute, func(context.Context, usecase.LockedStore) error {
			close(held)
			<-rel
			return nil
		})
	}()
	<-held
	return func() {
		close(rel)
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

// KeepAlive refreshes exactly the connections whose token was not
// refreshed for the idle duration, skips one whose lock another process
// holds, and leaves the others alone.
func TestKeepAliveRefreshesIdleConnectionsOnly(t *testing.T) {
	w := testworld.New(t, time.Hour)
	s := w.Stack(t, usecase.Options{})
	other := w.Stack(t, usecase.Options{})
	names := w.ConnectMany(t, s, 8)
	ctx := context.Background()
	store := repository.NewTokenRepository(s.DB, tokencrypt.Plaintext{})
	idle := map[string]bool{names[1]: true, names[4]: true, names[6]: true}
	before := map[string]int64{}
	for _, n := range names {
		if idle[n] {
			// As if granted 40 days ago and never used since.
			if err := s.DB.Exec(`UPDATE tokenguard_tokens SET obtained_at = now() - interval '40 days'
				WHERE connection_id = (SELECT id FROM tokenguard_connections WHERE name = ?)`, n).Error; err != nil {
				t.Fatal(err)
			}
		}
		before[n] = mustGetName(t, s, n).Version
	}

	release := holdLeaseOn(t, &testworld.Stack{DB: other.DB, Repo: other.Repo}, names[4])
	rep, err := s.UC.KeepAlive(ctx, store, 30*24*time.Hour, 4)
	release()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("keep-alive (30 days) with one idle connection locked elsewhere: %+v", rep)
	if rep.Due != 3 || rep.Refreshed != 2 || rep.Skipped != 1 || rep.Failed != 0 {
		t.Errorf("report %+v, want 3 due, 2 refreshed, 1 skipped", rep)
	}
	for _, n := range names {
		tok := mustGetName(t, s, n)
		refreshed := tok.Version != before[n]
		if want := idle[n] && n != names[4]; refreshed != want {
			t.Errorf("%s: refreshed %t, want %t", n, refreshed, want)
		}
		if refreshed && time.Since(tok.ObtainedAt) > time.Minute {
			t.Errorf("%s: refreshed but obtained_at %v", n, tok.ObtainedAt)
		}
	}
	if st := w.Provider.Stats(); st.Refreshes != 2 || st.RefreshReuse != 0 {
		t.Errorf("provider saw %d refreshes and %d reuses", st.Refreshes, st.RefreshReuse)
	}
	// The next pass takes the one that was busy, and nothing else.
	rep, err = s.UC.KeepAlive(ctx, store, 30*24*time.Hour, 4)
	if err != nil || rep.Due != 1 || rep.Refreshed != 1 {
		t.Errorf("second pass: %+v, %v; want the skipped one refreshed", rep, err)
	}
	tok := mustGetName(t, s, names[4])
	if tok.Version != before[names[4]]+1 || w.CallResource(t, tok.AccessToken.Reveal()) != http.StatusOK {
		t.Errorf("%s after the second pass: v%d (was v%d)", names[4], tok.Version, before[names[4]])
	}
}
