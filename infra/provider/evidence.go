package provider

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"sync"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
)

// Some refusals could be about the client or about the grant: Dex answers
// a dead, revoked or already-claimed refresh token 400 invalid_request,
// the code RFC 6749 gives a malformed request. The code alone cannot
// decide them; evidence, shared by every process through an EvidenceStore,
// does, in this order (docs/design.md):
//
//  1. the fingerprint: the provider gave this exact answer (status and
//     code) to a refresh token that cannot exist, presented by Check with
//     these client credentials, and did not refuse the client there; and
//     these credentials have worked for a real grant. The same answer to
//     a real grant is then "grant dead" (the use case re-reads before it
//     marks the connection needs_reauth).
//  2. the client works: a refresh or code exchange with the same
//     credentials in the same auth style succeeded within
//     clientWorksWithin. The refusal is about the grant, which evidence
//     does not show dead: the connection is failing at once.
//  3. neither: unclassified, paced fleet-wide as failing; never taken
//     for a refused client.
//
// A refusal that names the client (invalid_client, unauthorized_client,
// unsupported_grant_type, a 401) is not ambiguous: it stays
// ClientRejected.

// clientWorksWithin is how recent a success must be to vouch for the
// client.
const clientWorksWithin = time.Hour

// workedEvery spaces the writes that record a success, per process: the
// evidence is "within the last hour", not "this very second".
const workedEvery = time.Minute

// Fingerprint is a token endpoint's answer to a refresh token that cannot
// exist.
type Fingerprint struct {
	HTTPStatus          int
	Code                string // as reported (reportedCode)
	ClientAuthenticated bool   // the answer did not refuse the client
	At                  time.Time
}

// matches reports whether pe is the same answer. Only a named code
// counts: "unrecognized_error" stands for any code no table knows, and a
// provider answering everything in one way would match.
func (f Fingerprint) matches(pe *domain.ProviderError) bool {
	named := f.Code != "" && f.Code != "unrecognized_error"
	return named && f.ClientAuthenticated && f.HTTPStatus == pe.HTTPStatus && f.Code == pe.Code
}

// Evidence is what is known of a token endpoint and client credentials.
type Evidence struct {
	Fingerprint *Fingerprint // nil: never checked
	WorkedAt    time.Time    // last success; zero: none recorded
	WorkedStyle string       // its auth style (StyleHeader, StyleParams)
}

// EvidenceStore keeps Evidence per token URL, client id and credentials
// digest (Credentials), fleet-wide.
type EvidenceStore interface {
	LoadEvidence(ctx context.Context, tokenURL, clientID, credentials string) (Evidence, error)
	SaveFingerprint(ctx context.Context, tokenURL, clientID, credentials string, f Fingerprint) error
	SaveWorked(ctx context.Context, tokenURL, clientID, credentials, style string) error
}

// Credentials is the digest evidence is kept under: a changed client
// secret starts with none. It reveals nothing of the secret.
func Credentials(cfg *oauth2.Config) string {
	h := sha256.Sum256([]byte("tokenguard-evidence\x00" + cfg.ClientID + "\x00" + cfg.ClientSecret))
	return hex.EncodeToString(h[:16])
}

// EvidenceRules turns the rules on one by one; the zero value is none of
// them (the code table alone decides, invalid_request a refused client).
type EvidenceRules struct {
	Fingerprint  bool
	ClientWorks  bool
	Unclassified bool // rule 3: an ambiguous refusal is never a refused client
}

// AllEvidence is the rules tokenguard runs with.
var AllEvidence = EvidenceRules{Fingerprint: true, ClientWorks: true, Unclassified: true}

// WithEvidence weighs ambiguous refusals with the evidence in s (nil: no
// store, rule 3 alone).
func WithEvidence(s EvidenceStore, rules EvidenceRules) Option {
	return func(r *Refresher) { r.evidence, r.rules = s, rules }
}

// ambiguous reports whether an answer could be about the client or the
// grant: invalid_request, or a 400 whose code no table knows or that has
// none.
func ambiguous(status int, code string) bool {
	if code == "invalid_request" {
		return true
	}
	_, known := codes[code]
	return status == http.StatusBadRequest && !known
}

// weigh decides an ambiguous refusal pe, answered to a request in style,
// with the evidence.
func (r *Refresher) weigh(ctx context.Context, pe *domain.ProviderError, style oauth2.AuthStyle) {
	if !pe.Ambiguous {
		return
	}
	if r.rules.Unclassified {
		pe.Class = domain.Unclassified
	}
	if r.evidence == nil || !(r.rules.Fingerprint || r.rules.ClientWorks) {
		return
	}
	lctx, cancel := context.WithTimeout(ctx, storeTimeout)
	ev, err := r.evidence.LoadEvidence(lctx, r.cfg.Endpoint.TokenURL, r.cfg.ClientID, r.credentials)
	cancel()
	if err != nil {
		if r.log != nil {
			r.log.Warn("could not read what is known of the token endpoint's refusals; the refusal stays unclassified", "err", err)
		}
		return
	}
	if r.rules.Fingerprint && ev.Fingerprint == nil && !ev.WorkedAt.IsZero() {
		ev.Fingerprint = r.learn(ctx, style)
	}
	switch {
	case r.rules.Fingerprint && ev.Fingerprint != nil && ev.Fingerprint.matches(pe) && !ev.WorkedAt.IsZero():
		pe.Class, pe.Evidence = domain.GrantDead, domain.EvidenceFingerprint
	case r.rules.ClientWorks && ev.WorkedStyle == styleName(style) && r.now().Sub(ev.WorkedAt) < clientWorksWithin:
		pe.Class, pe.Evidence = domain.Unclassified, domain.EvidenceClientWorks
	}
}

// learn asks the endpoint, in style, what it answers a refresh token that
// cannot exist, and keeps the answer: the fingerprint of a provider no
// start-up check asked (a stored provider, TOKEN_ENDPOINT_CHECK=false).
// Asked once per credentials fleet-wide, when its answer is first needed;
// nil when no answer came or the made-up token was accepted.
func (r *Refresher) learn(ctx context.Context, style oauth2.AuthStyle) *Fingerprint {
	_, pe := r.exchange(ctx, domain.NewSecret("tokenguard-check-"+rand.Text()), style)
	if pe == nil || pe.HTTPStatus == 0 || pe.Class == domain.Transient || pe.Class == domain.EndpointMisconfigured {
		return nil
	}
	f := Fingerprint{HTTPStatus: pe.HTTPStatus, Code: pe.Code, At: r.now(),
		ClientAuthenticated: !clientAuthFailed(pe) && pe.Code != "unauthorized_client"}
	sctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	if err := r.evidence.SaveFingerprint(sctx, r.cfg.Endpoint.TokenURL, r.cfg.ClientID, r.credentials, f); err != nil && r.log != nil {
		r.log.Warn("could not keep the token endpoint's answer to a made-up refresh token", "err", err)
	}
	return &f
}

// worked records a success with style, at most once per workedEvery per
// process, in the background.
func (r *Refresher) worked(style oauth2.AuthStyle) {
	if r.evidence == nil {
		return
	}
	now := r.now()
	r.workedMu.Lock()
	if r.workedStyle == style && now.Sub(r.workedAt) < workedEvery {
		r.workedMu.Unlock()
		return
	}
	r.workedAt, r.workedStyle = now, style
	r.workedMu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
		defer cancel()
		// A failed write is tried again at the next success after
		// workedEvery (a database not migrated yet says so once a minute).
		if err := r.evidence.SaveWorked(ctx, r.cfg.Endpoint.TokenURL, r.cfg.ClientID, r.credentials, styleName(style)); err != nil && r.log != nil {
			r.log.Warn("could not record that the client works", "err", err)
		}
	}()
}

// evidenceState is the Refresher's part of the evidence.
type evidenceState struct {
	evidence    EvidenceStore
	rules       EvidenceRules
	credentials string

	workedMu    sync.Mutex
	workedAt    time.Time
	workedStyle oauth2.AuthStyle
}
