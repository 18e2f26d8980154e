package usecase_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// The pacing of unclassified answers, minute by minute on a moved clock:
// attempts at 0, 5, 15, 35 and 75 s, then one a minute; failing from the
// third; the grant untouched; a success ends the episode.
func TestUnclassifiedAnswersArePacedPerConnection(t *testing.T) {
	uc, store, ref, clock := setup(t, -time.Second) // expired: every call wants a refresh
	ref.err = &domain.ProviderError{HTTPStatus: 400, Code: "unrecognized_error", Class: domain.Unclassified}
	var attempts []time.Duration
	for at := time.Duration(0); at < 4*time.Minute; at += 500 * time.Millisecond {
		clock.now = t0.Add(at)
		before := ref.calls
		_, err := uc.Token(context.Background(), "acme")
		if !errors.Is(err, domain.ErrProviderUnavailable) || errors.Is(err, domain.ErrNeedsReauth) {
			t.Fatalf("at %v: %v", at, err)
		}
		if ref.calls > before {
			attempts = append(attempts, at)
		}
	}
	want := []time.Duration{0, 5 * time.Second, 15 * time.Second, 35 * time.Second, 75 * time.Second, 135 * time.Second, 195 * time.Second}
	if len(attempts) != len(want) {
		t.Fatalf("attempts at %v, want %v", attempts, want)
	}
	for i := range want {
		if attempts[i] != want[i] {
			t.Fatalf("attempts at %v, want %v", attempts, want)
		}
	}
	f := store.tok.Failure
	if !f.Failing || f.Failures != len(want) || f.HTTPStatus != 400 || store.tok.Status != domain.StatusActive || len(store.saves) != 0 {
		t.Errorf("stored %+v (status %s, %d saves): want failing, grant untouched", f, store.tok.Status, len(store.saves))
	}
	ref.err = nil
	clock.now = t0.Add(5 * time.Minute)
	if _, err := uc.Token(context.Background(), "acme"); err != nil {
		t.Fatal(err)
	}
	if store.tok.Failure.Failures != 0 {
		t.Errorf("after a success: failure %+v", store.tok.Failure)
	}
}

// A lost answer at a provider that accepts no refresh token twice blocks
// every further attempt, whatever the clock says, and is failing at once.
func TestLostAnswerWithoutReplayIsNeverRetried(t *testing.T) {
	uc, store, ref, clock := setup(t, -time.Second)
	ref.err = &domain.ProviderError{Lost: true, NoReplay: true, Err: errors.New("EOF")}
	for at := range 5 {
		clock.now = t0.Add(time.Duration(at) * time.Hour)
		if _, err := uc.Token(context.Background(), "acme"); !errors.Is(err, domain.ErrProviderUnavailable) {
			t.Fatalf("%v", err)
		}
	}
	if ref.calls != 1 {
		t.Errorf("%d provider calls, want 1", ref.calls)
	}
	if f := store.tok.Failure; !f.Failing || f.Code != "answer_lost" || !f.RetryAt.IsZero() {
		t.Errorf("failure %+v", f)
	}
}

// An ambiguous refusal that evidence says is the grant's (the client
// works) shows the connection failing at its first refusal, and callers
// are told refresh_failing; the control, the same answer without that
// evidence, is failing only from the third.
func TestRefusalOfTheGrantIsFailingAtOnce(t *testing.T) {
	for _, c := range []struct {
		evidence    string
		failingNext bool
	}{{domain.EvidenceClientWorks, true}, {"", false}} {
		uc, store, ref, _ := setup(t, -time.Second)
		ref.err = &domain.ProviderError{HTTPStatus: 400, Code: "invalid_request", Class: domain.Unclassified, Ambiguous: true, Evidence: c.evidence}
		_, err := uc.Token(context.Background(), "acme")
		if !errors.Is(err, domain.ErrRefreshFailing) || errors.Is(err, domain.ErrClientRejected) {
			t.Fatalf("evidence %q: %v, want refresh failing", c.evidence, err)
		}
		if f := store.tok.Failure; f.Failing != c.failingNext || f.Failures != 1 || f.Code != "invalid_request" || store.tok.Status != domain.StatusActive {
			t.Errorf("evidence %q: stored %+v (status %s), want failing %v", c.evidence, f, store.tok.Status, c.failingNext)
		}
	}
}
