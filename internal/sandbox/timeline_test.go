package sandbox

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"

	"golang.org/x/oauth2"
)

type uaTransport struct {
	base http.RoundTripper
	ua   string
}

func (u uaTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("User-Agent", u.ua)
	return u.base.RoundTrip(r)
}

// refreshAs refreshes rt with the given User-Agent.
func (e *env) refreshAs(t *testing.T, rt, ua string) *oauth2.Token {
	t.Helper()
	c := &http.Client{Transport: uaTransport{base: e.srv.Client().Transport, ua: ua}}
	tok, err := e.cfg.TokenSource(context.WithValue(t.Context(), oauth2.HTTPClient, c), &oauth2.Token{RefreshToken: rt}).Token()
	if err != nil {
		t.Fatalf("refresh as %s: %v", ua, err)
	}
	return tok
}

func TestTimelineRecordsRefreshesAndCallsPerSecond(t *testing.T) {
	e := newEnv(t, Options{})
	a, b := e.grant(t), e.grant(t)
	a1 := e.refreshAs(t, a.RefreshToken, "tokenguard-server/dev")
	a2 := e.refreshAs(t, a1.RefreshToken, "tokenguard-worker/dev")
	b1 := e.refreshAs(t, b.RefreshToken, "tokenguard-batch/v1")
	if _, err := e.refresh(a.RefreshToken); err == nil { // reuse: rejected, not a refresh
		t.Fatal("reuse accepted")
	}

	if c := e.resource(t, b1.AccessToken, "tokenguard-server/dev"); c != http.StatusOK {
		t.Fatalf("resource: %d", c)
	}
	e.resource(t, b1.AccessToken, "tokenguard-server/dev")
	e.resource(t, b.AccessToken, "tokenguard-batch/v1") // revoked by b's refresh
	e.resource(t, a2.AccessToken, "")                   // revoked by the reuse; Go's default User-Agent

	// Calls from many goroutines at once are all counted (run with -race).
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 10 {
				e.resource(t, b1.AccessToken, "tokenguard-worker/dev")
			}
		})
	}
	wg.Wait()

	tl := e.p.Timeline()
	want := []RefreshRecord{{Agent: "tokenguard-server", Grant: 1, Rotation: 1}, {Agent: "tokenguard-worker", Grant: 1, Rotation: 2}, {Agent: "tokenguard-batch", Grant: 2, Rotation: 1}}
	if len(tl.Refreshes) != len(want) {
		t.Fatalf("refreshes = %+v, want %d", tl.Refreshes, len(want))
	}
	for i, r := range tl.Refreshes {
		if r.Agent != want[i].Agent || r.Grant != want[i].Grant || r.Rotation != want[i].Rotation || r.At.IsZero() {
			t.Errorf("refresh %d = %+v, want %+v", i, r, want[i])
		}
		if i > 0 && r.At.Before(tl.Refreshes[i-1].At) {
			t.Errorf("refresh %d out of order", i)
		}
	}
	sum := map[string][2]int64{}
	for i, s := range tl.Resource {
		if s.Second.Nanosecond() != 0 || (i > 0 && s.Second.Before(tl.Resource[i-1].Second)) {
			t.Errorf("second %d: %v", i, s.Second)
		}
		v := sum[s.Agent]
		sum[s.Agent] = [2]int64{v[0] + s.OK, v[1] + s.Unauthorized}
	}
	wantSum := map[string][2]int64{"tokenguard-server": {2, 0}, "tokenguard-batch": {0, 1}, "Go-http-client": {0, 1}, "tokenguard-worker": {80, 0}}
	for agent, w := range wantSum {
		if sum[agent] != w {
			t.Errorf("%s: ok/401 = %v, want %v", agent, sum[agent], w)
		}
	}
	if st := e.p.Stats(); st.ResourceOK != 82 || st.Resource401 != 2 {
		t.Errorf("stats: %+v", st)
	}

	js, err := json.Marshal(tl)
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range []*oauth2.Token{a, a1, a2, b, b1} {
		for _, s := range []string{tok.AccessToken, tok.RefreshToken, strings.Split(tok.RefreshToken, ".")[0]} {
			if strings.Contains(string(js), s) {
				t.Fatalf("the timeline holds a token: %s", js)
			}
		}
	}

	e.p.ResetStats()
	if tl := e.p.Timeline(); len(tl.Refreshes) != 0 || len(tl.Resource) != 0 {
		t.Errorf("after ResetStats: %+v", tl)
	}
}
