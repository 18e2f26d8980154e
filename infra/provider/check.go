package provider

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"strings"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
)

// CheckVerdict is what Check could tell about the client's registration.
type CheckVerdict int

const (
	CheckOK               CheckVerdict = iota // only the made-up refresh token was rejected
	CheckUnreachable                          // no answer (DNS, refused, TLS, timeout)
	CheckNotJSON                              // an answer that is not JSON: not the token endpoint
	CheckNotTokenEndpoint                     // 404, 405 or a redirect
	CheckClientRejected                       // invalid_client, unauthorized_client or a 401
	CheckInconclusive                         // 5xx, 429, an unexpected code
)

// String names the verdict in logs.
func (v CheckVerdict) String() string {
	return [...]string{"ok", "unreachable", "not_json", "not_token_endpoint", "client_rejected", "inconclusive"}[v]
}

// CheckResult is Check's answer; it holds no secret and no response body.
type CheckResult struct {
	Verdict    CheckVerdict
	URL        string   // the token URL without query or credentials
	Styles     []string // styles tried, in order
	HTTPStatus int      // of the last answer; 0 when none came
	Code       string   // of the last answer, as reported
	Media      string   // of the last answer
	Err        error    // why no answer came (CheckUnreachable)
	Learned    bool     // an ambiguous refusal not refusing the client, kept as a dead grant's answer
}

// OK reports whether the endpoint accepted the client.
func (r CheckResult) OK() bool { return r.Verdict == CheckOK }

// Style is the last request's style: the accepted one when OK.
func (r CheckResult) Style() string {
	if len(r.Styles) == 0 {
		return ""
	}
	return r.Styles[len(r.Styles)-1]
}

// String is the operator's one line.
func (r CheckResult) String() string {
	answer := fmt.Sprintf("HTTP %d", r.HTTPStatus)
	if r.Code != "" {
		answer = fmt.Sprintf("%s (HTTP %d)", r.Code, r.HTTPStatus)
	}
	switch r.Verdict {
	case CheckOK:
		if r.Learned {
			return fmt.Sprintf("ok: %s answered a made-up refresh token %s with OAUTH_AUTH_STYLE=%s, not refusing the client; "+
				"learned as its answer to a dead grant (the same answer to a real grant, after a re-read, marks it needs_reauth); no refresh token was spent",
				r.URL, answer, r.Style())
		}
		return fmt.Sprintf("ok: %s accepted the client with OAUTH_AUTH_STYLE=%s and rejected only the made-up refresh token: %s; no refresh token was spent",
			r.URL, r.Style(), answer)
	case CheckUnreachable:
		return fmt.Sprintf("unreachable: no answer from %s: %v (check OAUTH_TOKEN_URL and the network)", r.URL, r.Err)
	case CheckNotJSON:
		return fmt.Sprintf("not a token endpoint: %s answered HTTP %d with %s, not JSON (check OAUTH_TOKEN_URL)",
			r.URL, r.HTTPStatus, cmp.Or(r.Media, "no Content-Type"))
	case CheckNotTokenEndpoint:
		what := "not found"
		if r.HTTPStatus == http.StatusMethodNotAllowed {
			what = "POST not allowed"
		} else if r.HTTPStatus/100 == 3 {
			what = "a redirect"
		}
		return fmt.Sprintf("not a token endpoint: %s answered HTTP %d, %s (check OAUTH_TOKEN_URL)", r.URL, r.HTTPStatus, what)
	case CheckClientRejected:
		return fmt.Sprintf("client rejected: %s answered %s to OAUTH_AUTH_STYLE=%s (check OAUTH_CLIENT_ID, OAUTH_CLIENT_SECRET, OAUTH_AUTH_STYLE)",
			r.URL, answer, strings.Join(r.Styles, " and to "))
	}
	return fmt.Sprintf("inconclusive: %s answered %s; the client could not be judged (try again later)", r.URL, answer)
}

// Check asks cfg's token endpoint whether it accepts the client with a made-up
// refresh token, sent as a refresher does: the client is authenticated before the
// grant is looked at (RFC 6749 §5.2). In auto it tries HTTP Basic, then the form
// body. client may be nil; opts authenticate the client as in ClientOptions.
func Check(ctx context.Context, cfg *oauth2.Config, client *http.Client, opts ...Option) CheckResult {
	styles := []oauth2.AuthStyle{cfg.Endpoint.AuthStyle}
	if cfg.Endpoint.AuthStyle == oauth2.AuthStyleAutoDetect {
		styles = []oauth2.AuthStyle{oauth2.AuthStyleInHeader, oauth2.AuthStyleInParams}
	}
	r := NewRefresher(cfg, client, opts...)
	shown := "OAUTH_TOKEN_URL" // without credentials and query
	if u, err := url.Parse(cfg.Endpoint.TokenURL); err == nil {
		u.User, u.RawQuery, u.Fragment = nil, "", ""
		shown = u.String()
	}
	var res CheckResult
	for _, style := range styles {
		a, _, pe := r.exchange(ctx, refreshForm("tokenguard-check-"+rand.Text()), style, true)
		media, _, _ := mime.ParseMediaType(a.header.Get("Content-Type"))
		status := a.status
		res = CheckResult{URL: shown, Styles: append(res.Styles, styleName(style)), HTTPStatus: status, Media: media}
		if pe != nil {
			res.Code = pe.Code
		}
		switch {
		case status == 0:
			res.Verdict, res.Err = CheckUnreachable, pe.Err
			if ue, ok := errors.AsType[*url.Error](pe.Err); ok {
				res.Err = ue.Err // the URL is in the line already
			}
		case status/100 == 3, status == http.StatusNotFound, status == http.StatusMethodNotAllowed:
			res.Verdict = CheckNotTokenEndpoint
		case pe != nil && (pe.Class == domain.GrantDead || pe.Code == "invalid_grant"):
			res.Verdict = CheckOK
		case pe != nil && pe.Ambiguous && pe.Code == "invalid_request" && status != http.StatusUnauthorized:
			res.Verdict, res.Learned = CheckOK, true
		case pe != nil && pe.Class == domain.ClientRejected, status == http.StatusUnauthorized:
			res.Verdict = CheckClientRejected
		case status/100 == 5, status == http.StatusTooManyRequests:
			res.Verdict = CheckInconclusive
		case media != "application/json" && !strings.HasSuffix(media, "+json") &&
			(media == "text/html" || !bytes.HasPrefix(bytes.TrimSpace(a.body[:min(64, len(a.body))]), []byte("{"))):
			res.Verdict = CheckNotJSON // neither a JSON media type nor a body opening like a JSON object
		default:
			// Includes a token issued for the made-up refresh token.
			res.Verdict = CheckInconclusive
		}
		if res.Verdict != CheckClientRejected {
			break
		}
	}
	return res
}

// RecordCheck keeps res in s as the endpoint's fingerprint (see weigh);
// verdicts other than CheckOK and CheckClientRejected are not kept.
func RecordCheck(ctx context.Context, s EvidenceStore, cfg *oauth2.Config, res CheckResult) error {
	if res.Verdict != CheckOK && res.Verdict != CheckClientRejected {
		return nil
	}
	f := Fingerprint{HTTPStatus: res.HTTPStatus, Code: res.Code, ClientAuthenticated: res.Verdict == CheckOK}
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	return s.SaveFingerprint(ctx, cfg.Endpoint.TokenURL, cfg.ClientID, Credentials(cfg), f)
}
