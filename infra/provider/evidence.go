package provider

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
)

const (
	clientWorksWithin = time.Hour
	workedEvery       = time.Minute // per process: the evidence is "within the hour"
)

// Fingerprint is a token endpoint's answer to a refresh token that cannot exist.
type Fingerprint struct {
	HTTPStatus          int
	Code                string // as reported (reportedCode)
	ClientAuthenticated bool   // the answer did not refuse the client
	At                  time.Time
}

// matches reports whether pe is the same answer. Only a named code counts:
// a provider answering everything one way would match "unrecognized_error".
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

// EvidenceStore keeps Evidence per token URL, client id and Credentials.
type EvidenceStore interface {
	LoadEvidence(ctx context.Context, tokenURL, clientID, credentials string) (Evidence, error)
	SaveFingerprint(ctx context.Context, tokenURL, clientID, credentials string, f Fingerprint) error
	SaveWorked(ctx context.Context, tokenURL, clientID, credentials, style string) error
}

// Credentials is the digest evidence is kept under (a new secret starts with
// none); it reveals nothing of the secret.
func Credentials(cfg *oauth2.Config) string {
	h := sha256.Sum256([]byte("tokenguard-evidence\x00" + cfg.ClientID + "\x00" + cfg.ClientSecret))
	return hex.EncodeToString(h[:16])
}

// EvidenceRules turns the rules on one by one; the zero value is none.
type EvidenceRules struct {
	Fingerprint  bool
	ClientWorks  bool
	Unclassified bool // rule 3: an ambiguous refusal is never a refused client
}

// AllEvidence is the rules tokenguard runs with.
var AllEvidence = EvidenceRules{Fingerprint: true, ClientWorks: true, Unclassified: true}

// WithEvidence weighs ambiguous refusals with s (nil: rule 3 alone).
func WithEvidence(s EvidenceStore, rules EvidenceRules) Option {
	return func(r *Refresher) { r.evidence, r.rules = s, rules }
}

// ambiguous: invalid_request, or a 400 with no or an unknown code.
func ambiguous(status int, code string) bool {
	if code == "invalid_request" {
		return true
	}
	_, known := codes[code]
	return status == http.StatusBadRequest && !known
}

// weigh decides a refusal that could be about the client or the grant (Dex
// answers a dead refresh token 400 invalid_request) with fleet-wide evidence, in
// order (docs/design.md): 1. the same answer to a made-up refresh token, the
// client not refused there and these credentials known to work: GrantDead; 2. a
// success in the same style within clientWorksWithin: about the grant but not
// dead; 3. otherwise Unclassified, never a refused client.
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
		r.log.Warn("could not read what is known of the token endpoint's refusals; the refusal stays unclassified", "err", err)
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

// learn takes and keeps the fingerprint no start-up check took (once per
// credentials fleet-wide); nil when no usable answer came.
func (r *Refresher) learn(ctx context.Context, style oauth2.AuthStyle) *Fingerprint {
	_, _, pe := r.exchange(ctx, refreshForm("tokenguard-check-"+rand.Text()), style, true)
	if pe == nil || pe.HTTPStatus == 0 || pe.Class == domain.Transient || pe.Class == domain.EndpointMisconfigured {
		return nil
	}
	f := Fingerprint{HTTPStatus: pe.HTTPStatus, Code: pe.Code, At: r.now(),
		ClientAuthenticated: !clientAuthFailed(pe) && pe.Code != "unauthorized_client"}
	sctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	if err := r.evidence.SaveFingerprint(sctx, r.cfg.Endpoint.TokenURL, r.cfg.ClientID, r.credentials, f); err != nil {
		r.log.Warn("could not keep the token endpoint's answer to a made-up refresh token", "err", err)
	}
	return &f
}

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
		if err := r.evidence.SaveWorked(ctx, r.cfg.Endpoint.TokenURL, r.cfg.ClientID, r.credentials, styleName(style)); err != nil {
			r.log.Warn("could not record that the client works", "err", err)
		}
	}()
}
