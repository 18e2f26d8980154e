package provider

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"math"
	"mime"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
)

// codes is what each token endpoint error code means for the grant. Any other
// code is reported as "unrecognized_error": a hostile provider could put anything
// in it, the credentials it was sent included. Only GrantDead rows can mark a
// connection needs_reauth, so each says the refresh token is dead.
var codes = map[string]domain.ErrorClass{
	// RFC 6749 §5.2.
	"invalid_grant":          domain.GrantDead,
	"invalid_client":         domain.ClientRejected,
	"unauthorized_client":    domain.ClientRejected,
	"unsupported_grant_type": domain.ClientRejected,
	"invalid_scope":          domain.ClientRejected,
	"invalid_request":        domain.ClientRejected,
	// Common additions (RFC 6749 §4.1.2.1, RFC 6750 §3.1, RFC 8628 §3.5).
	"temporarily_unavailable": domain.Transient,
	"server_error":            domain.Transient,
	"slow_down":               domain.Transient,
	"access_denied":           domain.Transient, // not a token endpoint code; too vague to kill a grant on
	"invalid_token":           domain.Transient, // a resource server's code; says nothing about the refresh token
	// RFC 9449 §5, §8: the proof is checked before the grant is looked at.
	"invalid_dpop_proof": domain.ClientRejected,
	"use_dpop_nonce":     domain.Transient, // answered once with the nonce by dpop.TokenTransport
	// Non-standard codes that say the refresh token is dead.
	"invalid_refresh_token": domain.GrantDead, // Slack (token rotation), in an HTTP 200 body {"ok":false,...}
	"BAD_REFRESH_TOKEN":     domain.GrantDead, // HubSpot, in a 400 body's "status" field
}

// classify says what an error answer means; the status outranks the body's code.
func classify(status int, code string) domain.ErrorClass {
	switch {
	case status >= 300 && status < 400, status == http.StatusNotFound, status == http.StatusMethodNotAllowed:
		return domain.EndpointMisconfigured
	case status >= 500, status == http.StatusTooManyRequests:
		return domain.Transient
	}
	if class, ok := codes[code]; ok {
		return class
	}
	if status == http.StatusUnauthorized {
		return domain.ClientRejected
	}
	return domain.Unclassified
}

// reportedCode is code as errors may show it.
func reportedCode(code string) string {
	if _, ok := codes[code]; code == "" || ok {
		return code
	}
	return "unrecognized_error"
}

// clientAuthFailed: the client was refused before the grant was looked at: the refresh token is unspent.
func clientAuthFailed(pe *domain.ProviderError) bool {
	return pe.Class == domain.ClientRejected && (pe.Code == "invalid_client" || pe.HTTPStatus == http.StatusUnauthorized)
}

const (
	maxAnswer   = 1 << 20                    // bytes of an answer read, as x/oauth2 does
	maxLifetime = 100 * 365 * 24 * time.Hour // beyond it a lifetime counts as absent
)

// Reasons for answers without a usable code; they name no part of the answer.
var (
	errRedirect   = errors.New("the token URL answers with a redirect")
	errNotFound   = errors.New("the token URL is not a token endpoint")
	errNotJSON    = errors.New("the answer is neither JSON nor a form")
	errNoAccess   = errors.New("the answer carries no access token")
	errNoCode     = errors.New("the answer names no error code")
	errReadAnswer = errors.New("reading the answer failed")
)

// answer is what an endpoint answered to one request.
type answer struct {
	status int // 0: no answer came
	header http.Header
	body   []byte // at most maxAnswer bytes
	fields fields // the body as far as it came; nil unless it was JSON or a form
	sent   time.Time
}

// post sends form to endpoint and reads the answer; a *url.Error names the method
// and URL, never the form. With spends (a refresh), a failure also says whether
// the provider may have processed the request (Lost) and whether ctx ended it.
func (c clientAuth) post(ctx context.Context, endpoint string, form url.Values, style oauth2.AuthStyle, spends bool) (answer, *domain.ProviderError) {
	req, err := c.request(ctx, endpoint, form, style)
	if err != nil {
		return answer{}, &domain.ProviderError{Class: domain.EndpointMisconfigured, Err: err}
	}
	a := answer{sent: c.now()}
	var written atomic.Bool
	if spends {
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			WroteRequest: func(i httptrace.WroteRequestInfo) { written.Store(i.Err == nil) },
		}))
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctxErr := ctx.Err(); spends && ctxErr != nil && !errors.Is(err, ctxErr) {
			err = errors.Join(ctxErr, err)
		}
		return a, &domain.ProviderError{Err: err, Lost: written.Load()}
	}
	defer resp.Body.Close()
	a.status, a.header = resp.StatusCode, resp.Header
	a.body, err = io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	a.fields = parseAnswer(a.header.Get("Content-Type"), a.body)
	if err != nil {
		// A timeout or reset mid-body: whatever the provider did is done.
		return a, &domain.ProviderError{HTTPStatus: a.status, Err: errors.Join(errReadAnswer, err), Lost: spends}
	}
	return a, nil
}

// exchange sends one token request in style and judges the answer; errors are free of secrets.
func (r *Refresher) exchange(ctx context.Context, form url.Values, style oauth2.AuthStyle, spends bool) (answer, domain.Grant, *domain.ProviderError) {
	a, pe := r.auth.post(ctx, r.cfg.Endpoint.TokenURL, maps.Clone(form), style, spends)
	if pe != nil {
		return a, domain.Grant{}, pe
	}
	g, pe := r.judge(a)
	return a, g, pe
}

// refreshForm is a refresh request's form; checks send a token that cannot exist.
func refreshForm(refreshToken string) url.Values {
	return url.Values{"grant_type": {"refresh_token"}, "refresh_token": {refreshToken}}
}

// judge turns an answer into a grant or a classified error; lifetimes count from its sending.
func (r *Refresher) judge(a answer) (domain.Grant, *domain.ProviderError) {
	status, f := a.status, a.fields
	code := f.str("error")
	if _, known := codes[f.str("status")]; code == "" && known {
		code = f.str("status") // HubSpot puts its code in "status"
	}
	dead := "" // the profile's dead-grant code the answer carries
	for _, d := range r.profile.DeadGrants {
		if (d.Status == 0 || d.Status == status) && f.str(d.Field) == d.Code {
			dead, code = d.Code, d.Code
			break
		}
	}
	if status >= 200 && status < 300 && code == "" && !f.okFalse() {
		if f.str("access_token") == "" {
			// A 200 without an access token is never a success.
			return domain.Grant{}, &domain.ProviderError{HTTPStatus: status, Class: domain.Unclassified, Err: errNoAccess}
		}
		return r.grant(f, a.sent), nil
	}
	pe := &domain.ProviderError{
		Code:       reportedCode(code),
		HTTPStatus: status,
		RetryAfter: RetryAfter(a.header.Get("Retry-After"), time.Now()),
		Class:      classify(status, code),
	}
	if dead != "" {
		pe.Code, pe.Class = dead, domain.GrantDead
	}
	// Decided by Refresher.weigh, not by the code.
	pe.Ambiguous = dead == "" && ambiguous(status, code) &&
		(pe.Class == domain.ClientRejected || pe.Class == domain.Unclassified)
	switch {
	case status >= 300 && status < 400:
		pe.Err = errRedirect
	case status == http.StatusNotFound || status == http.StatusMethodNotAllowed:
		pe.Err = errNotFound
	case code != "":
	case a.fields == nil:
		pe.Err = errNotJSON
	default:
		pe.Err = errNoCode
	}
	return domain.Grant{}, pe
}

func (r *Refresher) grant(f fields, sent time.Time) domain.Grant {
	g := domain.Grant{
		AccessToken:  domain.NewSecret(f.str("access_token")),
		TokenType:    tokenType(f.str("token_type")),
		RefreshToken: domain.NewSecret(f.str("refresh_token")),
	}
	if d, ok := f.lifetime("expires_in"); ok {
		g.Expiry = sent.Add(d)
	} else if r.defaultLifetime > 0 {
		g.Expiry = sent.Add(r.defaultLifetime)
	}
	if d, ok := f.refreshLifetime(); ok {
		g.RefreshExpiry = sent.Add(d)
	}
	switch {
	case !g.RefreshExpiry.IsZero():
	case r.profile.RefreshAbsolute.D > 0:
		// Counted from consent: the stored expiry holds for a rotated token.
		g.KeepRefreshExpiry = true
	case r.profile.RefreshIdle.D > 0:
		g.RefreshExpiry = sent.Add(r.profile.RefreshIdle.D)
	}
	g.Extra = collect(nil, r.profile.ExtraFields, f.str)
	var scope *string
	if json.Unmarshal(f["scope"], &scope) == nil && scope != nil {
		g.Scope, g.ScopeNamed = *scope, true
	}
	return g
}

// collect adds to m (made when needed) the keys get has a non-empty value for.
func collect(m map[string]string, keys []string, get func(string) string) map[string]string {
	for _, k := range keys {
		if v := get(k); v != "" {
			if m == nil {
				m = map[string]string{}
			}
			m[k] = v
		}
	}
	return m
}

// tokenType spells the type as RFC 6750 and x/oauth2 do.
func tokenType(t string) string { return cmp.Or(tokenTypes[strings.ToLower(t)], t) }

var tokenTypes = map[string]string{"": "Bearer", "bearer": "Bearer", "mac": "MAC", "basic": "Basic"}

// fields is a parsed answer: JSON values, or form values as JSON strings.
type fields map[string]json.RawMessage

// parseAnswer reads a JSON object, or a form when the provider says it is one; nil when neither.
func parseAnswer(contentType string, body []byte) (f fields) {
	if json.Unmarshal(body, &f) == nil && f != nil {
		return f
	}
	media, _, _ := mime.ParseMediaType(contentType)
	if media != "application/x-www-form-urlencoded" && media != "text/plain" {
		return nil
	}
	vals, err := url.ParseQuery(string(bytes.TrimSpace(body)))
	if err != nil || len(vals) == 0 {
		return nil
	}
	f = fields{}
	for k, v := range vals {
		f[k], _ = json.Marshal(v[0]) // a string always marshals
	}
	return f
}

// str is the string value of k; "" when absent or not a string.
func (f fields) str(k string) (s string) {
	_ = json.Unmarshal(f[k], &s)
	return s
}

// okFalse reports Slack's {"ok": false}.
func (f fields) okFalse() bool {
	var ok bool
	return json.Unmarshal(f["ok"], &ok) == nil && !ok
}

// refreshLifetimeKeys name the refresh token's lifetime, in order.
var refreshLifetimeKeys = []string{"refresh_token_expires_in", "x_refresh_token_expires_in"}

// refreshLifetime is the first usable refresh token lifetime of the answer.
func (f fields) refreshLifetime() (time.Duration, bool) {
	for _, k := range refreshLifetimeKeys {
		if d, ok := f.lifetime(k); ok {
			return d, true
		}
	}
	return 0, false
}

// lifetime reads seconds as a JSON number or a string (Microsoft Entra).
func (f fields) lifetime(k string) (time.Duration, bool) {
	var secs float64
	if json.Unmarshal(f[k], &secs) != nil {
		var err error
		if secs, err = strconv.ParseFloat(strings.TrimSpace(f.str(k)), 64); err != nil {
			return 0, false
		}
	}
	if math.IsNaN(secs) || secs <= 0 || secs > maxLifetime.Seconds() {
		return 0, false
	}
	return time.Duration(secs * float64(time.Second)), true
}
