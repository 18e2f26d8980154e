package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard"
	"github.com/tokenguard/tokenguard/domain"
)

// noFlows runs no connect flow.
type noFlows struct{}

func (noFlows) AuthCodeURL(_ context.Context, f tokenguard.ConnectFlow) (string, tokenguard.ConnectFlow, error) {
	return "", f, errors.New("no flows")
}
func (noFlows) Complete(context.Context, tokenguard.ConnectFlow, url.Values) (tokenguard.ConnectResult, error) {
	return tokenguard.ConnectResult{}, errors.New("no flows")
}
func (noFlows) RedeemFor(context.Context, string, func(string) error) (tokenguard.Connected, error) {
	return tokenguard.Connected{}, domain.ErrResultInvalid
}

// oneSession is one connect session, its flow opened by Open and spent by
// Finish with the right state.
type oneSession struct {
	noSessions
	sess   domain.ConnectSession
	opened chan string // the state Open bound
}

func (o oneSession) Peek(_ context.Context, token domain.Secret) (domain.ConnectSession, error) {
	if token.Reveal() != "tgs_good" {
		return domain.ConnectSession{}, domain.ErrUnauthorized
	}
	return o.sess, nil
}

func (o oneSession) Open(_ context.Context, token, _ domain.Secret, state, _ string) (domain.ConnectSession, error) {
	select {
	case o.opened <- state:
	default: // opened twice: the test's count already shows it
	}
	return o.sess, nil
}

// otherToken is token with its first character changed: a token that
// differs from the real one whatever the real one is.
func otherToken(token string) string {
	if strings.HasPrefix(token, "x") {
		return "y" + token[1:]
	}
	return "x" + token[1:]
}

func (o oneSession) Finish(_ context.Context, _ domain.Secret, state string) (domain.ConnectSession, error) {
	if state != o.sess.State {
		return domain.ConnectSession{}, domain.ErrUnauthorized
	}
	return o.sess, nil
}

// slowFlows cancels the browser's request (the tab is closed) before the
// grant is kept, and records whether its own context survived that.
type slowFlows struct {
	noFlows
	closeTab func()
	ctxErr   chan error
}

func (f slowFlows) AuthCodeURL(_ context.Context, fl tokenguard.ConnectFlow) (string, tokenguard.ConnectFlow, error) {
	fl.State = "st"
	return "http://p/auth?state=st", fl, nil
}

func (f slowFlows) Complete(ctx context.Context, fl tokenguard.ConnectFlow, q url.Values) (tokenguard.ConnectResult, error) {
	f.closeTab()
	time.Sleep(20 * time.Millisecond)
	f.ctxErr <- ctx.Err()
	return tokenguard.ConnectResult{Code: "tgr_pending", Connection: fl.Connection}, ctx.Err()
}

func flowServer(sess oneSession, flows ConnectFlows) *Server {
	return New(Deps{
		Keys: oneKey{key: "tgk_good"}, Sessions: sess, Flows: flows, DB: okPinger{},
		OAuth: &oauth2.Config{ClientID: "c", RedirectURL: "http://127.0.0.1:8080/oauth/callback",
			Endpoint: oauth2.Endpoint{AuthURL: "http://p/auth", TokenURL: "http://p/token"}},
		Edges: local,
	})
}

func TestCallbackKeepsTheGrantPendingAfterTheBrowserLeft(t *testing.T) {
	reqCtx, closeTab := context.WithCancel(context.Background())
	flows := slowFlows{closeTab: closeTab, ctxErr: make(chan error, 1)}
	sess := oneSession{sess: domain.ConnectSession{Connection: "acme", State: "st", Verifier: "ver", ReturnTo: "https://app.example/done"}}
	req := httptest.NewRequest("GET", "http://127.0.0.1:8080/oauth/callback?state=st&code=c", nil).WithContext(reqCtx)
	req.AddCookie(&http.Cookie{Name: flowCookie, Value: "tgf_" + strings.Repeat("x", 40)})
	w := httptest.NewRecorder()
	flowServer(sess, flows).Handler().ServeHTTP(w, req)
	if err := <-flows.ctxErr; err != nil {
		t.Errorf("the pending grant's context ended with the browser's request: %v", err)
	}
	if loc := w.Header().Get("Location"); w.Code != http.StatusSeeOther || loc != "https://app.example/done?connection=acme&result=tgr_pending&status=pending" {
		t.Errorf("callback answered %d Location %q", w.Code, loc)
	}
	if c := w.Result().Cookies(); len(c) != 1 || c[0].MaxAge >= 0 || !c[0].HttpOnly || c[0].SameSite != http.SameSiteLaxMode {
		t.Errorf("cookies %+v", c)
	}
}

// A callback whose state is not the flow's spends nothing: the flow's
// cookie stays, and the right answer still completes it.
func TestCallbackChecksTheStateBeforeItSpendsTheFlow(t *testing.T) {
	flows := slowFlows{closeTab: func() {}, ctxErr: make(chan error, 2)}
	sess := oneSession{sess: domain.ConnectSession{Connection: "acme", State: "st", ReturnTo: "https://app.example/done"}}
	h := flowServer(sess, flows).Handler()
	for _, c := range []struct {
		query string
		want  int
	}{{"state=forged&code=c", http.StatusBadRequest}, {"code=c", http.StatusBadRequest}, {"state=st&code=c", http.StatusSeeOther}} {
		req := httptest.NewRequest("GET", "http://127.0.0.1:8080/oauth/callback?"+c.query, nil)
		req.AddCookie(&http.Cookie{Name: flowCookie, Value: "tgf_" + strings.Repeat("x", 40)})
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != c.want {
			t.Errorf("callback ?%s: %d, want %d", c.query, w.Code, c.want)
		}
		if cleared := len(w.Result().Cookies()) > 0; cleared != (c.want == http.StatusSeeOther) {
			t.Errorf("callback ?%s: flow cookie cleared %t", c.query, cleared)
		}
	}
}

// The connect link shows a page naming the application and the
// connection; only its button's POST, with the CSRF token bound to the
// page's cookie, spends the session and goes to the provider.
func TestConnectLinkIsAPageWithAButton(t *testing.T) {
	sess := oneSession{sess: domain.ConnectSession{Connection: "acme", CreatedBy: "billing", ReturnTo: "https://app.example/done"}, opened: make(chan string, 1)}
	h := flowServer(sess, slowFlows{}).Handler()
	req := httptest.NewRequest("GET", "http://127.0.0.1:8080/oauth/connect?session=tgs_good", nil)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	body := w.Body.String()
	if w.Code != 200 || !strings.Contains(body, "billing") || !strings.Contains(body, "acme") || !strings.Contains(body, `method="post"`) ||
		!strings.Contains(w.Header().Get("Content-Security-Policy"), "frame-ancestors 'none'") {
		t.Fatalf("consent page: %d %s", w.Code, body)
	}
	if len(sess.opened) != 0 {
		t.Fatal("the GET opened the session")
	}
	cookies := w.Result().Cookies()
	csrf := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(body)
	if len(cookies) != 1 || csrf == nil {
		t.Fatalf("cookies %v, csrf %v", cookies, csrf)
	}
	post := func(form url.Values, withCookie bool) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "http://127.0.0.1:8080/oauth/connect", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if withCookie {
			req.AddCookie(cookies[0])
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	for name, c := range map[string]struct {
		form   url.Values
		cookie bool
	}{
		"no cookie":  {url.Values{"session": {"tgs_good"}, "csrf": {csrf[1]}}, false},
		"no token":   {url.Values{"session": {"tgs_good"}}, true},
		"wrong one":  {url.Values{"session": {"tgs_good"}, "csrf": {otherToken(csrf[1])}}, true},
		"other link": {url.Values{"session": {"tgs_other"}, "csrf": {csrf[1]}}, true},
	} {
		if w := post(c.form, c.cookie); w.Code != http.StatusForbidden || len(sess.opened) != 0 {
			t.Errorf("%s: %d, want 403 and nothing opened", name, w.Code)
		}
	}
	w = post(url.Values{"session": {"tgs_good"}, "csrf": {csrf[1]}}, true)
	if w.Code != http.StatusSeeOther || w.Header().Get("Location") != "http://p/auth?state=st" || <-sess.opened != "st" {
		t.Errorf("the button: %d %q", w.Code, w.Header().Get("Location"))
	}
}

type countingPinger struct{ n atomic.Int64 }

func (p *countingPinger) PingContext(context.Context) error { p.n.Add(1); return nil }

// A burst of /healthz from one address is cut at its rate, another
// address is still served, and the database is pinged at most once a
// second whatever the traffic.
func TestPublicRoutesLimitedPerAddress(t *testing.T) {
	db := &countingPinger{}
	s := New(Deps{Keys: oneKey{key: "tgk_good"}, DB: db, Edges: Edges{Hosts: local.Hosts, PublicRate: 5, PublicBurst: 10}})
	h := s.Handler()
	get := func(addr string) int {
		req := httptest.NewRequest("GET", "http://127.0.0.1:8080/healthz", nil)
		req.RemoteAddr = addr
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code
	}
	codes := map[int]int{}
	for range 100 {
		codes[get("192.0.2.1:4000")]++
	}
	if codes[200] < 10 || codes[200] > 20 || codes[429] < 80 {
		t.Errorf("100 requests from one address: %v, want about 10 served and the rest 429", codes)
	}
	if c := get("192.0.2.2:4000"); c != 200 {
		t.Errorf("another address: %d", c)
	}
	if n := db.n.Load(); n != 1 {
		t.Errorf("%d database pings for a burst within a second, want 1", n)
	}
}

// TestReturnToHostileTable: return_to under an allowed URL followed by
// any path of testdata/hostile_paths.json is refused (finding 6: "..;"
// and overlong UTF-8 dots were accepted); the accepted ones pass.
func TestReturnToHostileTable(t *testing.T) {
	raw, err := os.ReadFile("../../testdata/hostile_paths.json")
	if err != nil {
		t.Fatal(err)
	}
	var tab struct{ Refused, Accepted []string }
	if err := json.Unmarshal(raw, &tab); err != nil {
		t.Fatal(err)
	}
	allowed := []string{"http://app.example/return/"}
	for _, p := range tab.Refused {
		if returnAllowed(allowed[0]+p, allowed) {
			t.Errorf("return_to %q accepted", allowed[0]+p)
		}
	}
	for _, p := range tab.Accepted {
		if !returnAllowed(allowed[0]+p, allowed) {
			t.Errorf("control: return_to %q refused", allowed[0]+p)
		}
	}
}
