package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
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
	sent   time.Time
}

// post sends form to endpoint, the client authenticated in style, and reads
// the answer; a *url.Error names the method and URL, never the form. With
// spends (a refresh), a failure also says whether the provider may have
// processed the request (Lost) and whether ctx ended it.
func (r *Refresher) post(ctx context.Context, endpoint string, form url.Values, style oauth2.AuthStyle, spends bool) (answer, *domain.ProviderError) {
	req, err := r.requestTo(ctx, endpoint, form, style)
	if err != nil {
		return answer{}, &domain.ProviderError{Class: domain.EndpointMisconfigured, Err: err}
	}
	a := answer{sent: r.now()}
	var written atomic.Bool
	if spends {
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			WroteRequest: func(i httptrace.WroteRequestInfo) { written.Store(i.Err == nil) },
		}))
	}
	resp, err := r.client.Do(req)
	if err != nil {
		if ctxErr := ctx.Err(); spends && ctxErr != nil && !errors.Is(err, ctxErr) {
			err = errors.Join(ctxErr, err)
		}
		return a, &domain.ProviderError{Err: err, Lost: written.Load()}
	}
	defer resp.Body.Close()
	a.status, a.header = resp.StatusCode, resp.Header
	if a.body, err = io.ReadAll(io.LimitReader(resp.Body, maxAnswer)); err != nil {
		// A timeout or reset mid-body: whatever the provider did is done.
		return a, &domain.ProviderError{HTTPStatus: a.status, Err: errors.Join(errReadAnswer, err), Lost: spends}
	}
	return a, nil
}

// exchange sends one refresh_token grant request in style and reads the
// answer; errors are free of secrets.
func (r *Refresher) exchange(ctx context.Context, refreshToken domain.Secret, style oauth2.AuthStyle) (domain.Grant, *domain.ProviderError) {
	form := url.Values{"grant_type": {"refresh_token"}, "refresh_token": {refreshToken.Reveal()}}
	a, pe := r.post(ctx, r.cfg.Endpoint.TokenURL, form, style, true)
	if pe != nil {
		return domain.Grant{}, pe
	}
	return r.judge(a)
}

// judge turns an answer into a grant or a classified error; lifetimes count
// from when it was sent, erring early.
func (r *Refresher) judge(a answer) (domain.Grant, *domain.ProviderError) {
	status := a.status
	f, parsed := parseAnswer(a.header.Get("Content-Type"), a.body)
	code := f.str("error")
	if _, known := codes[f.str("status")]; code == "" && known {
		code = f.str("status") // HubSpot puts its code in "status"
	}
	dead := r.profileDead(status, f)
	if dead != "" {
		code = dead
	}
	if status >= 200 && status < 300 && code == "" && !f.okFalse() {
		g, err := r.grant(f, a.sent)
		if err == nil {
			return g, nil
		}
		// A 200 without an access token is never a success.
		return domain.Grant{}, &domain.ProviderError{HTTPStatus: status, Class: domain.Unclassified, Err: err}
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
	case !parsed:
		pe.Err = errNotJSON
	default:
		pe.Err = errNoCode
	}
	return domain.Grant{}, pe
}

// profileDead is the profile's dead-grant code the answer carries, in its
// field and status; "" when none.
func (r *Refresher) profileDead(status int, f fields) string {
	for _, d := range r.deadGrants {
		if (d.Status == 0 || d.Status == status) && f.str(d.Field) == d.Code {
			return d.Code
		}
	}
	return ""
}

// grant reads a successful answer.
func (r *Refresher) grant(f fields, sent time.Time) (domain.Grant, error) {
	at := f.str("access_token")
	if at == "" {
		return domain.Grant{}, errNoAccess
	}
	g := domain.Grant{
		AccessToken:  domain.NewSecret(at),
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
	case r.refreshAbsolute > 0:
		// Counted from consent: the stored expiry holds for a rotated token.
		g.KeepRefreshExpiry = true
	case r.refreshIdle > 0:
		g.RefreshExpiry = sent.Add(r.refreshIdle)
	}
	g.Extra = f.extra(r.extraFields)
	g.Scope, g.ScopeNamed = f.scope()
	return g, nil
}

// tokenType spells the type as RFC 6750 and x/oauth2 do.
func tokenType(t string) string {
	switch strings.ToLower(t) {
	case "", "bearer":
		return "Bearer"
	case "mac":
		return "MAC"
	case "basic":
		return "Basic"
	}
	return t
}

// fields is a parsed answer: JSON values, or form values as JSON strings.
type fields map[string]json.RawMessage

// parseAnswer reads a JSON object, or a form when the provider says it is one.
func parseAnswer(contentType string, body []byte) (f fields, ok bool) {
	if json.Unmarshal(body, &f) == nil && f != nil {
		return f, true
	}
	media, _, _ := mime.ParseMediaType(contentType)
	if media != "application/x-www-form-urlencoded" && media != "text/plain" {
		return nil, false
	}
	vals, err := url.ParseQuery(string(bytes.TrimSpace(body)))
	if err != nil || len(vals) == 0 {
		return nil, false
	}
	f = fields{}
	for k, v := range vals {
		if raw, err := json.Marshal(v[0]); err == nil {
			f[k] = raw
		}
	}
	return f, true
}

// str is the string value of k; "" when absent or not a string.
func (f fields) str(k string) string {
	var s string
	if json.Unmarshal(f[k], &s) != nil {
		return ""
	}
	return s
}

// scope is the answer's scope, and whether it names one as a string.
func (f fields) scope() (string, bool) {
	var s *string
	if json.Unmarshal(f["scope"], &s) != nil || s == nil {
		return "", false
	}
	return *s, true
}

// extra is the string values of keys, nil when none is there.
func (f fields) extra(keys []string) map[string]string {
	var out map[string]string
	for _, k := range keys {
		if v := f.str(k); v != "" {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
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
	raw := f[k]
	var secs float64
	if json.Unmarshal(raw, &secs) != nil {
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return 0, false
		}
		var err error
		if secs, err = strconv.ParseFloat(strings.TrimSpace(s), 64); err != nil {
			return 0, false
		}
	}
	if math.IsNaN(secs) || secs <= 0 || secs > maxLifetime.Seconds() {
		return 0, false
	}
	return time.Duration(secs * float64(time.Second)), true
}
