package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"
)

// defaultReturnTo is where connect sessions send the browser back unless a
// test names another: the application's page, never reached (the
// browsers stop at any host but the server and the sandbox).
const defaultReturnTo = "http://app.example/settings/connected"

var (
	csrfField    = regexp.MustCompile(`name="csrf" value="([^"]+)"`)
	sessionField = regexp.MustCompile(`name="session" value="([^"]+)"`)
)

// personAt is a browser with its own cookie jar, at the server and the
// sandboxes: subject is who logs in at the provider (login_hint), scopes
// what they tick ("" all). It stops at the application (a return_to at
// app.example or app.example.com).
func personAt(s *stack, subject, scopes string) *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, Timeout: 15 * time.Second, CheckRedirect: func(req *http.Request, _ []*http.Request) error {
		switch {
		case strings.HasPrefix(req.URL.Host, "app.example"):
			return http.ErrUseLastResponse
		case req.URL.Host == s.addr:
			return nil
		default: // a provider
			q := req.URL.Query()
			if subject != "" {
				q.Set("login_hint", subject)
			}
			if scopes != "" {
				q.Set("consent_scope", scopes)
			}
			req.URL.RawQuery = q.Encode()
			return nil
		}
	}}
}

// press opens the connect link in c and, when the answer is the consent
// page, presses its button as the person would: the form's POST with the
// page's CSRF token, followed as far as c follows. It returns the last
// answer and its body.
func press(t *testing.T, c *http.Client, connectURL string) (*http.Response, string) {
	t.Helper()
	resp, body := get(t, c, connectURL)
	csrf, sess := csrfField.FindStringSubmatch(body), sessionField.FindStringSubmatch(body)
	if resp.StatusCode != http.StatusOK || csrf == nil || sess == nil {
		return resp, body
	}
	u, _ := url.Parse(connectURL)
	u.RawQuery = ""
	req, _ := http.NewRequest(http.MethodPost, u.String(), strings.NewReader(url.Values{"session": {sess[1]}, "csrf": {csrf[1]}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "text/html")
	return do(t, c, req)
}

func get(t *testing.T, c *http.Client, target string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, target, nil)
	req.Header.Set("Accept", "text/html")
	return do(t, c, req)
}

func do(t *testing.T, c *http.Client, req *http.Request) (*http.Response, string) {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// returned is where the callback sent the browser: the return_to with its
// query, or nil if the flow did not get there.
func returned(resp *http.Response) *url.URL {
	if resp.StatusCode != http.StatusSeeOther {
		return nil
	}
	u, err := url.Parse(resp.Header.Get("Location"))
	if err != nil || u.Host == "" {
		return nil
	}
	return u
}

// redeemed is POST /connect-results's answer.
type redeemed struct {
	Connection    string   `json:"connection"`
	Account       string   `json:"account"`
	Scopes        []string `json:"scopes"`
	MissingScopes []string `json:"missing_scopes"`
	Code          string   `json:"code"` // of an error
}

// redeem is the application's backend: it redeems result with key.
func (s *stack) redeem(key, result string) (int, redeemed, string) {
	s.t.Helper()
	js, _ := json.Marshal(map[string]string{"result": result})
	code, body := s.doWith(key, http.MethodPost, "/connect-results", string(js))
	var r redeemed
	_ = json.Unmarshal([]byte(body), &r)
	return code, r, body
}

// connectVia connects name as docs/http-api.md says: a session (extra: more
// fields of its body), the person's consent in a browser of their own,
// the browser back at return_to with a pending result, the backend's
// redemption. It fails the test unless every step does what it should.
func (s *stack) connectVia(name, extra, subject, scopes string) redeemed {
	s.t.Helper()
	resp, body := press(s.t, personAt(s, subject, scopes), s.connectSession(name, extra))
	back := returned(resp)
	if back == nil || back.Query().Get("status") != "pending" || back.Query().Get("connection") != name ||
		!strings.HasPrefix(back.Query().Get("result"), "tgr_") {
		s.t.Fatalf("consent for %s: %s Location %q %.300s", name, resp.Status, resp.Header.Get("Location"), body)
	}
	code, r, raw := s.redeem(s.key, back.Query().Get("result"))
	if code != http.StatusOK || r.Connection != name {
		s.t.Fatalf("redeem the result for %s: %d %s", name, code, raw)
	}
	return r
}
