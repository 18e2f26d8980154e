package provider_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/postgres"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/testdb"
	"github.com/tokenguard/tokenguard/internal/waitfor"
	"github.com/tokenguard/tokenguard/repository"
)

// Refusals that could be about the client or the grant are decided by
// evidence kept in Postgres, asked of the sandbox in Dex's shape (a dead
// refresh token answered 400 invalid_request). Each rule is shown with
// its control: the rule removed, the answer falls to the next rule, and
// with none the code table alone calls it a refused client (the old
// behaviour).

type dexFixture struct {
	p        *sandbox.Provider
	cfg      *oauth2.Config
	evidence *repository.RefusalEvidence
}

func newDex(t *testing.T) dexFixture {
	t.Helper()
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	db, err := postgres.Open(context.Background(), testdb.New(t), postgres.Pool{MaxOpenConns: 4}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = postgres.Close(db) })
	p, err := sandbox.New(sandbox.Dex(sandbox.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p.Handler())
	t.Cleanup(srv.Close)
	return dexFixture{p: p, cfg: p.OAuth2Config(srv.URL), evidence: repository.NewRefusalEvidence(db)}
}

// refresher is a process's refresher with the given rules.
func (f dexFixture) refresher(rules provider.EvidenceRules) *provider.Refresher {
	return provider.NewRefresher(f.cfg, nil, provider.WithEvidence(f.evidence, rules))
}

// grant is a live refresh token, refreshed once through r (so the client
// has worked, when r records it).
func (f dexFixture) grant(t *testing.T, r *provider.Refresher, waitWorked bool) domain.Secret {
	t.Helper()
	tok, err := sandbox.Grant(context.Background(), f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	g, err := r.Refresh(context.Background(), domain.NewSecret(tok.RefreshToken))
	if err != nil {
		t.Fatal(err)
	}
	if waitWorked {
		waitfor.Until(t, 5*time.Second, "the success recorded", func() bool {
			ev, err := f.evidence.LoadEvidence(context.Background(), f.cfg.Endpoint.TokenURL, f.cfg.ClientID, provider.Credentials(f.cfg))
			return err == nil && !ev.WorkedAt.IsZero()
		})
	}
	return g.RefreshToken
}

// check runs the start-up check and keeps its answer.
func (f dexFixture) check(t *testing.T, cfg *oauth2.Config) provider.CheckResult {
	t.Helper()
	res := provider.Check(context.Background(), cfg, nil)
	if err := provider.RecordCheck(context.Background(), f.evidence, cfg, res); err != nil {
		t.Fatal(err)
	}
	return res
}

// refused refreshes a revoked grant's refresh token through r.
func refused(t *testing.T, f dexFixture, r *provider.Refresher, rt domain.Secret) *domain.ProviderError {
	t.Helper()
	f.p.RevokeAll()
	_, err := r.Refresh(context.Background(), rt)
	var pe *domain.ProviderError
	if !errors.As(err, &pe) || pe.HTTPStatus != 400 || pe.Code != "invalid_request" {
		t.Fatalf("refresh of a revoked grant: %v, want Dex's 400 invalid_request", err)
	}
	return pe
}

func TestCheckLearnsDexAnswerInOneRequest(t *testing.T) {
	f := newDex(t)
	f.p.ResetStats()
	res := f.check(t, f.cfg)
	if res.Verdict != provider.CheckOK || !res.Learned || len(res.Styles) != 1 {
		t.Fatalf("check: %s (verdict %v, learned %v, styles %v); want ok, learned, one request", res, res.Verdict, res.Learned, res.Styles)
	}
	if n := f.p.Stats().RefreshRejected; n != 1 {
		t.Errorf("the check sent %d requests, want 1", n)
	}
	ev, err := f.evidence.LoadEvidence(context.Background(), f.cfg.Endpoint.TokenURL, f.cfg.ClientID, provider.Credentials(f.cfg))
	if err != nil || ev.Fingerprint == nil || ev.Fingerprint.HTTPStatus != 400 || ev.Fingerprint.Code != "invalid_request" || !ev.Fingerprint.ClientAuthenticated {
		t.Fatalf("stored fingerprint %+v, %v; want 400 invalid_request, client authenticated", ev.Fingerprint, err)
	}

	// Control: a wrong secret is refused as a client (both styles tried),
	// kept under its own credentials as a refusal.
	wrong := *f.cfg
	wrong.ClientSecret = "wrong"
	if res := f.check(t, &wrong); res.Verdict != provider.CheckClientRejected {
		t.Fatalf("wrong secret: %s, want client rejected", res)
	}
	ev, err = f.evidence.LoadEvidence(context.Background(), wrong.Endpoint.TokenURL, wrong.ClientID, provider.Credentials(&wrong))
	if err != nil || ev.Fingerprint == nil || ev.Fingerprint.ClientAuthenticated {
		t.Fatalf("wrong secret: stored %+v, %v; want a refused client", ev.Fingerprint, err)
	}
}

// Rule 1: the provider's answer to a refresh token that cannot exist,
// given to a real grant, says the grant is dead.
func TestFingerprintSaysDexGrantDead(t *testing.T) {
	f := newDex(t)
	r := f.refresher(provider.AllEvidence)
	rt := f.grant(t, r, true)
	f.check(t, f.cfg)
	pe := refused(t, f, r, rt)
	if pe.Class != domain.GrantDead || pe.Evidence != domain.EvidenceFingerprint || !errors.Is(pe, domain.ErrGrantRevoked) {
		t.Fatalf("class %v evidence %q; want grant_dead by the fingerprint", pe.Class, pe.Evidence)
	}

	// Control: without the rule the same answer is the next rule's (the
	// client works: failing, not dead).
	g := newDex(t)
	r = g.refresher(provider.EvidenceRules{ClientWorks: true, Unclassified: true})
	rt = g.grant(t, r, true)
	g.check(t, g.cfg)
	if pe := refused(t, g, r, rt); pe.Class != domain.Unclassified || pe.Evidence != domain.EvidenceClientWorks {
		t.Fatalf("without the fingerprint rule: class %v evidence %q; want unclassified by client_works", pe.Class, pe.Evidence)
	}
}

// Rule 1 needs credentials that have worked: a provider that answers a
// broken client as it answers an unknown refresh token cannot pass its
// refusal of the client off as dead grants.
func TestFingerprintNeedsCredentialsThatWorked(t *testing.T) {
	f := newDex(t)
	r := f.refresher(provider.AllEvidence)
	tok, err := sandbox.Grant(context.Background(), f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.check(t, f.cfg)
	if pe := refused(t, f, r, domain.NewSecret(tok.RefreshToken)); pe.Class != domain.Unclassified || pe.Evidence != "" {
		t.Fatalf("class %v evidence %q; want unclassified", pe.Class, pe.Evidence)
	}
}

// Rule 2: the client just worked for another grant, and the refusal is
// not the provider's answer to an unknown refresh token: it is the
// grant's, shown failing at once (usecase), never a refused client. A
// fingerprint of a code no table knows never counts.
func TestClientWorksSaysRefusalIsTheGrants(t *testing.T) {
	for _, c := range []struct {
		rules    provider.EvidenceRules
		evidence string
	}{
		{provider.AllEvidence, domain.EvidenceClientWorks},
		{provider.EvidenceRules{Fingerprint: true, Unclassified: true}, ""}, // control: the rule removed
	} {
		f := newDex(t)
		r := f.refresher(c.rules)
		rt := f.grant(t, r, true)
		f.p.SetRefreshFault(func() sandbox.Fault { return sandbox.FaultUnknownCode })
		_, err := r.Refresh(context.Background(), rt)
		var pe *domain.ProviderError
		if !errors.As(err, &pe) || pe.Class != domain.Unclassified || pe.Evidence != c.evidence || errors.Is(err, domain.ErrClientRejected) {
			t.Fatalf("rules %+v: %v (evidence %q); want unclassified by %q", c.rules, err, pe.Evidence, c.evidence)
		}
	}
}

// A provider no start-up check asked (a stored provider) is asked once,
// when its answer is first needed, and the answer kept for every process.
func TestFingerprintLearnedWhenNoCheckRan(t *testing.T) {
	f := newDex(t)
	r := f.refresher(provider.AllEvidence)
	first, second := f.grant(t, r, true), f.grant(t, r, true)
	f.p.ResetStats()
	if pe := refused(t, f, r, first); pe.Class != domain.GrantDead || pe.Evidence != domain.EvidenceFingerprint {
		t.Fatalf("class %v evidence %q; want grant_dead by a learned fingerprint", pe.Class, pe.Evidence)
	}
	if n := f.p.Stats().RefreshRejected; n != 2 {
		t.Errorf("%d requests refused, want 2 (the grant's and one made-up)", n)
	}
	other := f.refresher(provider.AllEvidence) // another process
	if pe := refused(t, f, other, second); pe.Class != domain.GrantDead {
		t.Fatalf("another process: class %v; want grant_dead", pe.Class)
	}
	if n := f.p.Stats().RefreshRejected; n != 3 {
		t.Errorf("%d requests refused in all, want 3: the fingerprint is asked once", n)
	}
}

// Rule 3: with no evidence the refusal is unclassified, never a refused
// client; the control, no rule at all, is the old reading of the code.
func TestAmbiguousRefusalWithoutEvidenceIsUnclassified(t *testing.T) {
	f := newDex(t)
	r := f.refresher(provider.AllEvidence)
	rt := f.grant(t, provider.NewRefresher(f.cfg, nil), false) // refreshed by a refresher that records nothing
	if pe := refused(t, f, r, rt); pe.Class != domain.Unclassified || errors.Is(pe, domain.ErrClientRejected) {
		t.Fatalf("class %v; want unclassified", pe.Class)
	}
	g := newDex(t)
	r = g.refresher(provider.EvidenceRules{})
	rt = g.grant(t, r, false)
	if pe := refused(t, g, r, rt); pe.Class != domain.ClientRejected {
		t.Fatalf("without any rule: class %v; want client_rejected (the code table alone)", pe.Class)
	}
}

// Control of the whole: a client whose secret is wrong is still refused
// as a client, whatever was learned for the right one, and its grants
// are untouched.
func TestWrongSecretStillClientRejectedAtDex(t *testing.T) {
	f := newDex(t)
	good := f.refresher(provider.AllEvidence)
	rt := f.grant(t, good, true)
	f.check(t, f.cfg)
	wrong := *f.cfg
	wrong.ClientSecret = "wrong"
	_, err := provider.NewRefresher(&wrong, nil, provider.WithEvidence(f.evidence, provider.AllEvidence)).Refresh(context.Background(), rt)
	var pe *domain.ProviderError
	if !errors.As(err, &pe) || pe.Class != domain.ClientRejected || !errors.Is(err, domain.ErrClientRejected) {
		t.Fatalf("wrong secret: %v, want client_rejected", err)
	}
	if _, err := good.Refresh(context.Background(), rt); err != nil {
		t.Fatalf("the grant after the refused client: %v, want it untouched", err)
	}
}
