package e2e

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/internal/waitfor"
)

// freezeFor is how long the provider process is stopped: longer than the
// refresh timeout, the lock wait and the API timeout of the apps, shorter
// than the default answer deadline (2m).
const freezeFor = 60 * time.Second

// testFrozenProvider: the strict sandbox provider (rotation; a second
// presentation of a refresh token is a reuse that revokes the grant) runs
// as a process of its own, and server, worker and batch share one
// connection with 3 s tokens. The provider is frozen (SIGSTOP: the kernel
// still accepts connections and requests queue, nothing is answered) for
// a minute, then resumes and answers its queue in order. With the default
// answer deadline the request that presented the refresh token is awaited
// across the freeze: the provider sees no reuse, the late answer is
// stored, the connection stays active and calls succeed again; callers of
// the token API get an answer (503) within their deadline throughout.
// The control gives up on the answer at the refresh timeout
// (TOKEN_ANSWER_DEADLINE=2s, as before the deadline existed): the
// provider rotates the token for a client that has gone, the next
// presentation is a reuse, and the grant dies.
func testFrozenProvider(t *testing.T, bin string, control bool) {
	p := startProvider(t, bin, nil, "--access-token-lifetime", lifetime.String())
	extra := []string{"OAUTH_CLIENT_ID=tokenguard", "OAUTH_CLIENT_SECRET=tokenguard-secret",
		"OAUTH_TOKEN_URL=" + p.url + "/oauth2/token", "OAUTH_AUTH_URL=" + p.url + "/oauth2/auth", "API_BASE_URL=" + p.url}
	if control {
		extra = append(extra, "TOKEN_ANSWER_DEADLINE=2s")
	}
	s := newStack(t, bin, stackOpts{lifetime: lifetime, skew: skew})
	s.env = append(s.env, extra...)
	s.migrate()
	const conn = "acme"
	grant := run(t, bin, "sandbox", baseEnv(), "", "grant", "--url", p.url)
	if grant.code != 0 {
		t.Fatalf("sandbox grant: exit %d: %s", grant.code, grant.stderr)
	}
	if r := run(t, bin, "tokenctl", s.env, grant.stdout, "import", "--connection", conn); r.code != 0 {
		t.Fatalf("tokenctl import: exit %d: %s", r.code, r.stderr)
	}
	server := s.start("server")
	s.waitHealthy(server)
	worker := s.start("worker")
	batchApp := s.start("batch", "--every", "500ms")
	d := startDriver(s, conn, 2, 100*time.Millisecond) // server, worker (events) and batch all ask for tokens
	tokens := startLoad(s, conn, "/connections/"+conn+"/token", 3)
	waitfor.Until(t, 20*time.Second, "no refresh before the freeze", func() bool { return p.stats().Refreshes >= 2 })

	before := p.stats()
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	tokens.reset()
	time.Sleep(freezeFor)
	during, slowest := tokens.window()
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()

	if control {
		waitfor.Until(t, 90*time.Second, "control: the grant outlived a second presentation", func() bool {
			_, status := storedVersionStatus(t, s.dbURL, conn)
			return status == "needs_reauth"
		})

	} else {
		// The queued answers arrive in order; tokens are served again
		// once the late answer is stored.
		waitfor.Until(t, 30*time.Second, "no token served after the provider resumed", func() bool {
			return p.stats().Refreshes >= before.Refreshes+2 && tokens.served()
		})
	}
	after := tokens.finish()
	ok503 := during["503 provider_unavailable"] + during["503 refresh_failing"] + during["503 busy"]
	d.finish()
	st := p.stats()
	version, status := storedVersionStatus(t, s.dbURL, conn)
	s.stop(batchApp)
	s.stop(worker)
	s.stop(server)
	t.Logf("provider: %d refreshes (%d before the freeze), %d rejected, %d reuse; stored version %d, %s; "+
		"token API during the freeze: %v (slowest %v); after it (%v): %v",
		st.Refreshes, before.Refreshes, st.RefreshRejected, st.RefreshReuse, version, status,
		during, slowest.Round(time.Millisecond), time.Since(resumed).Round(time.Second), after)
	if control {
		if st.RefreshReuse == 0 || status != "needs_reauth" {
			t.Errorf("control: reuse %d, status %s: want the grant killed by a second presentation", st.RefreshReuse, status)
		}
		return
	}
	if st.RefreshReuse != 0 || status != "active" {
		t.Errorf("reuse %d, status %s: want 0 and active", st.RefreshReuse, status)
	}
	if slowest > 6*time.Second || during["0 "] > 0 {
		t.Errorf("token API during the freeze: slowest %v, %d calls without an answer: want every answer within the API timeout",
			slowest, during["0 "])
	}
	for k, n := range during {
		if k != "200" && !strings.HasPrefix(k, "503 ") {
			t.Errorf("token API during the freeze answered %q %d times", k, n)
		}
	}
	if ok503 == 0 {
		t.Errorf("token API during the freeze: %v, want 503s", during)
	}
	if after["200"] == 0 {
		t.Errorf("token API after the freeze: %v, want tokens again", after)
	}
}
