package usecase

import (
	"errors"
	"testing"

	"github.com/tokenguard/tokenguard/domain"
)

type regression struct {
	id            string
	known, stored int64
}

func watched(c *tokenCache) *[]regression {
	var got []regression
	c.onRegress = func(id string, known, stored int64) { got = append(got, regression{id, known, stored}) }
	return &got
}

func TestReadBehindAKnownVersionIsARegression(t *testing.T) {
	u := &RefreshTokenUseCase{}
	c := &u.cache
	got := watched(c)
	c.setTrusted(true)
	c.put(cached(4), c.begin(), 0)
	c.knew("acme", 5, false) // this process stored version 5
	c.put(cached(4), c.begin(), 0)
	if len(*got) != 1 || (*got)[0] != (regression{"acme", 5, 4}) {
		t.Fatalf("regressions = %v, want acme 5 -> 4", *got)
	}
	// Reported once per loss, across cache epochs (a listener reconnection).
	c.setTrusted(false)
	c.setTrusted(true)
	c.put(cached(4), c.begin(), 0)
	if len(*got) != 1 {
		t.Fatalf("reported again: %v", *got)
	}
	// Read under the lock, the grant then rejected: the reason says why.
	if r := u.reasonFor(cached(4), &domain.ProviderError{Code: "invalid_grant", Class: domain.GrantDead}); r != ReasonRolledBack {
		t.Errorf("reason = %q, want %q", r, ReasonRolledBack)
	}
	// A newer version stored since: history moves on, nothing is lost.
	c.knew("acme", 5, true)
	if r := c.rolledBack("acme", 5); r {
		t.Error("version 5 stored again counts as rolled back")
	}
}

// The control: a read that began before a newer version was announced
// is only late, as the change feed always races the reads.
func TestReadBegunBeforeTheAnnouncementIsNoRegression(t *testing.T) {
	var c tokenCache
	got := watched(&c)
	c.setTrusted(true)
	c.put(cached(4), c.begin(), 0)
	m := c.begin()         // a read starts, finds 4...
	c.announced("acme", 5) // ...while another process commits 5
	c.put(cached(4), m, 0)
	if len(*got) != 0 {
		t.Fatalf("a late read reported as a regression: %v", *got)
	}
	c.put(cached(4), c.begin(), 0) // a read begun after the announcement
	if len(*got) != 1 {
		t.Fatalf("regressions = %v, want one", *got)
	}
}

func TestAnnouncementsAllocateNoHistory(t *testing.T) {
	var c tokenCache
	c.announced("globex", 9)
	if c.len() != 0 {
		t.Fatalf("an announcement made %d slots", c.len())
	}
}

func TestReasonForOtherErrors(t *testing.T) {
	var u RefreshTokenUseCase
	if r := u.reasonFor(cached(1), &domain.ProviderError{Code: "invalid_grant", Class: domain.GrantDead}); r != "invalid_grant" {
		t.Errorf("reason = %q", r)
	}
	if r := u.reasonFor(cached(1), errors.New("x")); r != "grant rejected" {
		t.Errorf("reason = %q", r)
	}
}

// After the lock, only what the process wrote or read itself counts: the
// needs_reauth a pass stores for a rejected grant is announced (at the
// next version) before the pass is observed, and is no regression.
func TestRejectedGrantChecksOnlyOwnVersions(t *testing.T) {
	var c tokenCache
	got := watched(&c)
	c.setTrusted(true)
	c.put(cached(2), c.begin(), 0)
	c.announced("acme", 3) // the pass's own needs_reauth, announced
	c.read("acme", 2, everything, true)
	if len(*got) != 0 {
		t.Fatalf("the pass's own needs_reauth taken for a regression: %v", *got)
	}
	c.knew("acme", 4, false) // stored by this process
	c.read("acme", 3, everything, true)
	if len(*got) != 1 || (*got)[0] != (regression{"acme", 4, 3}) {
		t.Fatalf("regressions = %v, want acme 4 -> 3", *got)
	}
	// Announced by another process, then the listener reconnected (a
	// failover): no longer the pass's own write.
	c.announced("acme", 5)
	c.setTrusted(false)
	c.setTrusted(true)
	c.read("acme", 4, everything, true)
	if len(*got) != 2 || (*got)[1] != (regression{"acme", 5, 4}) {
		t.Fatalf("regressions = %v, want acme 5 -> 4 second", *got)
	}
}

// announced is what the change listener does with an announcement
// (RefreshTokenUseCase.Invalidate): the version is known committed, older
// cached tokens go.
func (c *tokenCache) announced(id string, version int64) {
	c.knew(id, version, true)
	c.invalidate(id, version)
}
