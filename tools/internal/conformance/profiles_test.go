package conformance_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/provider/profiles"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/testdb"
	"github.com/tokenguard/tokenguard/tools/internal/conformance"
)

// The profile matrix's columns.
const (
	pcRefresh   = "refresh at expiry (2 stacks)"
	pcDeadGrant = "dead grant, in the provider's words"
	pcControl   = "control: the same answer without the profile"
	pcLost      = "lost answer within the grace window"
	pcNoGrace   = "lost answer without a grace window"
)

// TestProfiles runs, for every provider profile, what the profile declares
// against the sandbox switched to behave that way (sandbox.Like: its
// dead-grant answer, grace window, refresh expiry, per-tenant token URL,
// extra token fields), with the stacks configured by OAUTH_PROFILE and the
// sandbox's token URL (every URL of a profile can be overridden). One row
// per profile (CONFORMANCE_PROFILES_OUT=file writes the table).
func TestProfiles(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	matrix := conformance.NewMatrix(pcRefresh, pcDeadGrant, pcControl, pcLost, pcNoGrace)
	t.Cleanup(func() {
		md := matrix.Markdown()
		t.Logf("profile matrix:\n%s", md)
		if out := os.Getenv("CONFORMANCE_PROFILES_OUT"); out != "" {
			if err := os.WriteFile(out, []byte(md), 0o644); err != nil {
				t.Errorf("write %s: %v", out, err)
			}
		}
	})
	all := profiles.All()
	for _, p := range all {
		matrix.AddProvider(p.Name)
	}
	for _, p := range all {
		t.Run(p.Name, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			cells := map[string]func(*run, *sandbox.Provider, profiles.Profile) conformance.Cell{
				pcRefresh: profileRefresh, pcDeadGrant: profileDeadGrant,
			}
			if own := ownDeadCode(p); own != "" {
				cells[pcControl] = profileControl
			}
			if p.Grace.Known && p.Grace.D > 0 {
				cells[pcLost] = profileLostAnswer
			}
			if p.Grace.Known && p.Grace.D == 0 && p.Rotation != profiles.RotationNo {
				cells[pcNoGrace] = profileLostNoGrace
			}
			for _, col := range []string{pcRefresh, pcDeadGrant, pcControl, pcLost, pcNoGrace} {
				sc, ok := cells[col]
				if !ok {
					matrix.Set(p.Name, col, conformance.Cell{Pass: true, NA: true})
					continue
				}
				t.Run(col, func(t *testing.T) {
					sb, s := profileServer(t, p)
					r := &run{t: t, s: s, db: db}
					cell := conformance.Cell{Note: "setup failed"}
					defer func() {
						if t.Failed() {
							cell.Pass = false
							if r.failure != "" {
								cell.Note = r.failure
							}
						}
						matrix.Set(p.Name, col, cell)
					}()
					cell = sc(r, sb, p)
					cell.Pass = !t.Failed()
				})
			}
		})
	}
}

// ownDeadCode is the profile's dead-grant code that the generic table does
// not know, "" when it has none (the control would show nothing).
func ownDeadCode(p profiles.Profile) string {
	for _, d := range p.DeadGrants {
		if d.Code != "invalid_grant" && d.Code != "invalid_refresh_token" && d.Code != "BAD_REFRESH_TOKEN" {
			return d.Code
		}
	}
	return ""
}

// profileServer is a sandbox behaving as p declares, with 2 s tokens.
func profileServer(t *testing.T, p profiles.Profile) (*sandbox.Provider, *server) {
	sb, err := sandbox.New(sandbox.Like(p, sandbox.Options{ClientSecret: clientSecret, AccessTokenLifespan: lifetime}))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(sb.Handler())
	t.Cleanup(srv.Close)
	cfg := sb.OAuth2Config(srv.URL)
	return sb, &server{name: p.Name, oauth: cfg, api: srv.URL,
		grant:    func(ctx context.Context) (*oauth2.Token, error) { return sandbox.Grant(ctx, cfg) },
		ownReuse: func() int { return int(sb.Stats().RefreshReuse) }}
}

// profileStacks are n stacks configured with OAUTH_PROFILE=p (profile
// "" leaves it unset: the generic behaviour).
func profileStacks(r *run, n int, profile string) *env {
	var extra []string
	if profile != "" {
		extra = append(extra, "OAUTH_PROFILE="+profile)
	}
	return newStacksFor(r, r.s, n, "", extra...)
}

// profileRefresh: two stacks ask at once when the token is due; one
// refresh at the profile's token URL (a tenant's where it has one), no
// reuse, the API answers 200.
func profileRefresh(r *run, sb *sandbox.Provider, p profiles.Profile) conformance.Cell {
	const name = "acme"
	e := profileStacks(r, 2, p.Name)
	e.connect(name)
	before := sb.Stats()
	e.waitDue(name)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, st := range e.stacks {
		wg.Go(func() {
			if code, err := st.call(ctx, name); err != nil || code != http.StatusOK {
				r.failf("API call: %d, %v", code, err)
			}
		})
	}
	wg.Wait()
	after := sb.Stats()
	refreshes, reuse := int(after.Refreshes-before.Refreshes), int(after.RefreshReuse-before.RefreshReuse)
	if refreshes != 1 || reuse != 0 {
		r.failf("%d refreshes, %d reuse; want 1, 0", refreshes, reuse)
	}
	note := ""
	if u := r.s.oauth.Endpoint.TokenURL; p.TokenURL != "" && pathParam(p) {
		note = "at the tenant's token URL " + u[len(r.s.api):]
	}
	return conformance.Cell{Refreshes: refreshes, Reuse: reuse, Note: note}
}

// pathParam reports whether the profile's token URL varies per tenant in
// its path (the sandbox then serves only the tenant's URL).
func pathParam(p profiles.Profile) bool {
	return sandbox.Like(p, sandbox.Options{}).Tenant != ""
}

// profileDeadGrant: the grant is revoked; the provider answers in its own
// words (GitHub: 200 bad_refresh_token); the connection is needs_reauth
// after one refused request.
func profileDeadGrant(r *run, sb *sandbox.Provider, p profiles.Profile) conformance.Cell {
	const name = "revoked"
	e := profileStacks(r, 1, p.Name)
	e.connect(name)
	sb.RevokeAll()
	before := sb.Stats()
	e.waitDue(name)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 2 {
		if _, err := e.stacks[0].tokens.RefreshToken.Token(ctx, name); !errors.Is(err, domain.ErrNeedsReauth) {
			r.failf("Token = %v, want ErrNeedsReauth", err)
		}
	}
	refused := int(sb.Stats().RefreshRejected - before.RefreshRejected)
	if refused != 1 {
		r.failf("%d refused requests, want 1", refused)
	}
	if st := e.stored(name); st.Status != domain.StatusNeedsReauth {
		r.failf("stored status %q, want needs_reauth", st.Status)
	}
	answer := "400 invalid_grant"
	if len(p.DeadGrants) > 0 {
		d := p.DeadGrants[0]
		answer = fmt.Sprintf("%d %s", d.Status, d.Code)
	}
	return conformance.Cell{Note: fmt.Sprintf("needs_reauth after %d request (%s)", refused, answer)}
}

// profileControl: the same dead-grant answer to stacks without the
// profile is not recognised: an unclassified answer, the connection stays
// active (the still-valid token served) and backs off.
func profileControl(r *run, sb *sandbox.Provider, p profiles.Profile) conformance.Cell {
	const name = "control"
	e := profileStacks(r, 1, "")
	e.connect(name)
	sb.RevokeAll()
	e.waitDue(name)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := e.stacks[0].tokens.RefreshToken.Token(ctx, name)
	if errors.Is(err, domain.ErrNeedsReauth) || (err != nil && !errors.Is(err, domain.ErrProviderUnavailable)) {
		r.failf("without the profile: Token = %v, want the still-valid token or provider unavailable", err)
	}
	if st := e.stored(name); st.Status != domain.StatusActive || st.Failure.Failures != 1 {
		r.failf("without the profile: stored status %q, failure %+v; want active, one unclassified answer", st.Status, st.Failure)
	}
	return conformance.Cell{Note: fmt.Sprintf("without the profile %s is an unknown code: the grant stays active, the connection backs off (caught)", ownDeadCode(p))}
}

// profileLostAnswer: the provider processes a refresh and its answer is
// lost; within the profile's grace window the same refresh token is
// accepted again (the sandbox answers as the first time), the connection
// stays active and nothing counts as reuse.
func profileLostAnswer(r *run, sb *sandbox.Provider, p profiles.Profile) conformance.Cell {
	const name = "lost"
	e := profileStacks(r, 1, p.Name)
	e.connect(name)
	var lost sync.Once
	sb.SetRefreshFault(func() sandbox.Fault {
		f := sandbox.FaultNone
		lost.Do(func() { f = sandbox.FaultLostAnswer })
		return f
	})
	before := sb.Stats()
	e.waitDue(name)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if code, err := e.stacks[0].call(ctx, name); err != nil || code != http.StatusOK {
		r.failf("API call after a lost answer: %d, %v", code, err)
	}
	after := sb.Stats()
	if after.LostAnswers-before.LostAnswers != 1 || after.GraceReplays-before.GraceReplays < 1 || after.RefreshReuse != before.RefreshReuse {
		r.failf("sandbox: %+v -> %+v; want 1 lost answer, a grace replay, no reuse", before, after)
	}
	if st := e.stored(name); st.Status != domain.StatusActive {
		r.failf("stored status %q, want active", st.Status)
	}
	return conformance.Cell{Refreshes: int(after.Refreshes - before.Refreshes), Note: fmt.Sprintf("grace %s: answered again, still active", p.Grace)}
}

// profileLostNoGrace: where the profile declares no grace window, a
// refresh whose answer was lost is never presented again, by this process
// or another: one request, no reuse at the provider, the connection
// failing (answer_lost) and never needs_reauth.
func profileLostNoGrace(r *run, sb *sandbox.Provider, p profiles.Profile) conformance.Cell {
	const name = "lostnograce"
	e := profileStacks(r, 2, p.Name)
	e.connect(name)
	var asked atomic.Int64
	sb.SetRefreshFault(func() sandbox.Fault {
		if asked.Add(1) == 1 {
			return sandbox.FaultLostAnswer
		}
		return sandbox.FaultNone
	})
	before := sb.Stats()
	e.waitDue(name)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, s := range e.stacks {
		if _, err := s.tokens.RefreshToken.Token(ctx, name); errors.Is(err, domain.ErrNeedsReauth) {
			r.failf("after a lost answer: %v", err)
		}
	}
	after := sb.Stats()
	if asked.Load() != 1 || after.LostAnswers-before.LostAnswers != 1 || after.RefreshReuse != before.RefreshReuse {
		r.failf("sandbox: %d requests, %+v -> %+v; want 1 request, 1 lost answer, no reuse", asked.Load(), before, after)
	}
	if st := e.stored(name); st.Status != domain.StatusActive || !st.Failure.Failing || st.Failure.Code != "answer_lost" {
		r.failf("stored status %q, failure %+v; want active and failing with answer_lost", st.Status, st.Failure)
	}
	return conformance.Cell{Refreshes: int(after.Refreshes - before.Refreshes), Note: "grace none: presented once, then failing (answer_lost), no reuse"}
}
