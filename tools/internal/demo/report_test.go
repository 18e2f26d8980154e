package demo

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/internal/sandbox"
)

func TestExpectedRefreshes(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	cycle := 2 * time.Second
	for _, c := range []struct {
		name              string
		granted, from, to time.Time
		want              int
	}{
		{"use ends before the token goes stale", t0, t0, at(1900 * time.Millisecond), 0},
		{"stale exactly at the end", t0, t0, at(2 * time.Second), 1},
		{"continuous use over 12s from the grant", t0, t0, at(12 * time.Second), 6},
		{"continuous use, 13.9s", t0, t0, at(13900 * time.Millisecond), 6},
		{"use starts after the token went stale", t0, at(5 * time.Second), at(10 * time.Second), 3}, // 5, 7, 9
		{"use starts while fresh", t0, at(time.Second), at(6 * time.Second), 3},                     // 2, 4, 6
		{"empty window", t0, at(3 * time.Second), at(3 * time.Second), 0},
	} {
		if got := ExpectedRefreshes(c.granted, c.from, c.to, cycle); got != c.want {
			t.Errorf("%s: ExpectedRefreshes = %d, want %d", c.name, got, c.want)
		}
	}
	if got := ExpectedRefreshes(t0, t0, at(time.Hour), 0); got != 0 {
		t.Errorf("zero cycle: %d", got)
	}
}

// refresh redeems rt at sb with the client's credentials in the Basic
// header or the form body, as app (its User-Agent), and returns the
// status and the new refresh token.
func refresh(t *testing.T, sb *Sandbox, rt string, basic bool, app string) (int, string) {
	t.Helper()
	cfg := sb.OAuth2Config(sb.URL)
	form := url.Values{"grant_type": {"refresh_token"}, "refresh_token": {rt}}
	if !basic {
		form.Set("client_id", cfg.ClientID)
		form.Set("client_secret", cfg.ClientSecret)
	}
	req, _ := http.NewRequest(http.MethodPost, cfg.Endpoint.TokenURL, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("User-Agent", "tokenguard-"+app)
	if basic {
		req.SetBasicAuth(url.QueryEscape(cfg.ClientID), url.QueryEscape(cfg.ClientSecret))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		RefreshToken string `json:"refresh_token"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body.RefreshToken
}

// Each provider is reported apart, from what its own sandbox saw: a reuse
// at one fails the run in its name only, and a refused Basic probe at the
// form-only one is explained, not counted as a failure.
func TestProviderReportsArePerProvider(t *testing.T) {
	start := func(opts sandbox.Options) *Sandbox {
		sb, err := StartSandbox("127.0.0.1:0", opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(sb.Close)
		return sb
	}
	basic := start(sandbox.Options{ClientAuth: sandbox.ClientAuthBasic})
	form := start(sandbox.Options{ClientAuth: sandbox.ClientAuthPost, OmitExpiresIn: true, ClientID: "form-client", ClientSecret: "form-secret"})
	grant := func(sb *Sandbox) string {
		tok, err := sandbox.Grant(context.Background(), sb.OAuth2Config(sb.URL))
		if err != nil {
			t.Fatal(err)
		}
		return tok.RefreshToken
	}
	rtA, rtB := grant(basic), grant(form)
	if code, _ := refresh(t, basic, rtA, true, "server"); code != http.StatusOK {
		t.Fatalf("refresh at the Basic-only sandbox: %d", code)
	}
	if code, _ := refresh(t, form, rtB, true, "worker"); code != http.StatusUnauthorized {
		t.Fatalf("Basic at the form-only sandbox: %d, want 401", code)
	}
	if code, _ := refresh(t, form, rtB, false, "worker"); code != http.StatusOK {
		t.Fatalf("refresh at the form-only sandbox: %d", code)
	}
	if code, _ := refresh(t, form, rtB, false, "batch"); code != http.StatusBadRequest {
		t.Fatalf("reuse at the form-only sandbox: %d, want 400", code)
	}

	t0 := time.Now()
	granted := map[string]time.Time{"acme": t0, "initech": t0}
	a := (&demoProvider{sb: basic, lifetime: 3 * time.Second, conns: []string{"acme"}, quirks: "HTTP Basic only"}).
		report(granted, time.Second, t0, t0.Add(10*time.Second))
	b := (&demoProvider{name: "sandbox-form", sb: form, lifetime: 4 * time.Second, conns: []string{"initech"}, noExpiry: true, quirks: "form body only",
		refused: "auth style auto's HTTP Basic probe"}).
		report(granted, time.Second, t0, t0.Add(10*time.Second))

	// 3s tokens refreshed 1s early: at 2, 4, 6, 8, 10 s. A first token
	// without expiry is refreshed when refused, at 4 s, then at 7 and 10 s.
	if a.Refreshes != 1 || a.RefreshReuse != 0 || a.RefreshesByApp["server"] != 1 || a.ExpectedRefreshes != 5 || len(a.problems()) != 0 || len(a.Notes) != 0 {
		t.Errorf("Basic-only provider: %+v, problems %v", a, a.problems())
	}
	if b.Refreshes != 1 || b.RefreshReuse != 1 || b.RefreshRejected != 2 || b.RefreshesByApp["worker"] != 1 || b.ExpectedRefreshes != 3 {
		t.Errorf("form-only provider: %+v", b)
	}
	if p := b.problems(); len(p) != 1 || p[0] != "provider sandbox-form saw 1 refresh-token reuse" {
		t.Errorf("form-only provider's problems: %q", p)
	}
	if len(b.Notes) != 1 || b.Notes[0] != "1 refresh request(s) refused, no grant touched: auth style auto's HTTP Basic probe" {
		t.Errorf("form-only provider's notes: %q", b.Notes)
	}

	rep := &Report{DurationSeconds: 10, RefreshSkew: 1, Connections: []string{"acme", "initech"},
		Apps: map[string]AppReport{}, Providers: []ProviderReport{a, b}, Problems: b.problems()}
	var out strings.Builder
	rep.PrintTable(&out)
	for _, want := range []string{
		"2 connections at 2 providers",
		"  OAUTH_*       HTTP Basic only  acme                 1         5      0      0\n",
		"  sandbox-form  form body only   initech              1         3      1      0\n",
		"sandbox-form: 1 refresh request(s) refused, no grant touched: auth style auto's HTTP Basic probe\n",
		"FAIL:\n  - provider sandbox-form saw 1 refresh-token reuse\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the table lacks %q:\n%s", want, out.String())
		}
	}
}
