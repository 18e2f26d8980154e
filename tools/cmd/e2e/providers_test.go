package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/waitfor"
)

// providerProc is a sandbox provider run as a process of its own
// (bin/sandbox).
type providerProc struct {
	t   *testing.T
	cmd *exec.Cmd
	url string
}

// startProvider runs bin/sandbox with args and the client secret in env.
func startProvider(t *testing.T, bin string, env []string, args ...string) *providerProc {
	t.Helper()
	cmd := exec.Command(filepath.Join(bin, "sandbox"), append([]string{"--addr", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(baseEnv(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("sandbox %v: %v\n%s", args, err, stderr.String())
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	return &providerProc{t: t, cmd: cmd, url: strings.TrimSpace(line)}
}

func (p *providerProc) stats() sandbox.Stats {
	p.t.Helper()
	resp, err := http.Get(p.url + "/stats")
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	var st sandbox.Stats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		p.t.Fatal(err)
	}
	return st
}

// call is one resource call through the server.
type call struct {
	conn       string
	start, end time.Time
	code       int
	body       string
}

// testTwoProviders: two providers as processes of their own, "crm" (the
// OAUTH_* one, HTTP Basic only) and "mail" (stored with tokenctl provider
// add, form body only), one connection on each (mail's connected through
// the server's connect flow), the three apps under load on both, and
// mail's client secret rotated mid-run: the provider refuses the old
// secret at once, tokenctl provider update hands the processes the new
// one. Both connections refresh independently at their own provider, no
// connection is marked needs_reauth, no call started after the update
// fails, and neither provider sees a reuse.
func testTwoProviders(t *testing.T, bin string) {
	s, crm, mail, rotate := startTwoProviders(t, bin)
	server := s.start("server")
	s.waitHealthy(server)
	// globex is connected at mail through the server's connect flow.
	s.connectVia("globex", `,"provider":"mail"`, "", "")
	if code, body := s.do(http.MethodGet, "/connections", ""); code != http.StatusOK ||
		!strings.Contains(body, `"connection":"globex","provider":"mail"`) {
		t.Fatalf("GET /connections: %d %s", code, body)
	}
	worker := s.start("worker")
	batchApp := s.start("batch", "--every", "500ms")
	load := startTwoConnectionLoad(s, "acme", "globex")

	time.Sleep(4 * lifetime)
	rejectedBefore, rotated, switched := rotate()
	batchApp.mu.Lock()
	roundsBefore := len(batchApp.lines)
	batchApp.mu.Unlock()
	time.Sleep(4 * lifetime)
	load.finish()
	js := waitEvents(t, s.dbURL, load.events, 30*time.Second)
	s.stop(batchApp)
	s.stop(worker)
	s.stop(server)
	crmSt, mailSt := crm.stats(), mail.stats()

	// No connection was marked needs_reauth.
	out := run(t, bin, "tokenctl", s.env, "", "status")
	if out.code != 0 || strings.Contains(out.stdout, "needs_reauth") || strings.Count(out.stdout, " active ") != 2 {
		t.Errorf("tokenctl status: exit %d\n%s%s", out.code, out.stdout, out.stderr)
	}
	ok, windowFailed, perConn := checkCallsAcrossRotation(t, load.calls, rotated, switched)
	if len(load.evBad) > 0 {
		t.Errorf("%d events not accepted, e.g. %q", len(load.evBad), load.evBad[0])
	}
	for _, id := range load.events {
		if j, ok := js[id]; !ok || j.State != "completed" {
			t.Errorf("event %d: %+v (present: %t)", id, j, ok)
		}
	}
	rs := rounds(t, batchApp)
	for i, r := range rs {
		if i >= roundsBefore && (r.Failed > 0 || len(r.Errors) > 0) {
			t.Errorf("batch round %d after the switch failed: %+v", r.Round, r)
		}
	}
	t.Logf("two providers: %d calls ok (acme %d, globex %d), %d of globex's failed between the rotation and the switch (%v); %d events; %d batch rounds",
		ok, perConn["acme"], perConn["globex"], windowFailed, switched.Sub(rotated).Round(time.Millisecond), len(load.events), len(rs))
	t.Logf("crm: %d refreshes, %d reuse, %d rejected, calls by app %v", crmSt.Refreshes, crmSt.RefreshReuse, crmSt.RefreshRejected, crmSt.ResourceByAgent)
	t.Logf("mail: %d refreshes, %d reuse, %d rejected, calls by app %v", mailSt.Refreshes, mailSt.RefreshReuse, mailSt.RefreshRejected, mailSt.ResourceByAgent)
	for name, st := range map[string]sandbox.Stats{"crm": crmSt, "mail": mailSt} {
		if st.RefreshReuse != 0 {
			t.Errorf("%s: refresh-token reuse %d", name, st.RefreshReuse)
		}
		// Several expiries each, refreshed at their own provider.
		if st.Refreshes < 4 {
			t.Errorf("%s: %d refreshes, want one per expiry", name, st.Refreshes)
		}
		for _, agent := range []string{"tokenguard-server", "tokenguard-worker", "tokenguard-batch"} {
			if st.ResourceByAgent[agent] == 0 {
				t.Errorf("%s: no API call from %s", name, agent)
			}
		}
	}
	if mailSt.RefreshRejected <= rejectedBefore {
		t.Error("mail never refused the old secret: the rotation was not exercised")
	}
}

// startTwoProviders starts crm (the OAUTH_* provider) and mail (stored
// with tokenctl provider add) and imports acme's grant at crm. rotate
// rotates mail's client secret: mail refuses the old one at once, and
// once it has refused a refresh, tokenctl provider update hands the
// processes the new one; it returns mail's refusals before, and when the
// rotation and the switch happened.
func startTwoProviders(t *testing.T, bin string) (s *stack, crm, mail *providerProc, rotate func() (rejectedBefore int64, rotated, switched time.Time)) {
	const crmSecret, mailSecret, mailSecret2 = "crm-secret-1", "mail-secret-1", "mail-secret-2"
	secretFile := filepath.Join(t.TempDir(), "mail-secret")
	if err := os.WriteFile(secretFile, []byte(mailSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	crm = startProvider(t, bin, []string{"SANDBOX_CLIENT_SECRET=" + crmSecret},
		"--client-id", "crm-client", "--auth-style", "header", "--access-token-lifetime", lifetime.String())
	mail = startProvider(t, bin, nil, "--client-id", "mail-client", "--auth-style", "params",
		"--access-token-lifetime", lifetime.String(), "--client-secret-file", secretFile)

	s = newStack(t, bin, stackOpts{lifetime: lifetime, skew: skew})
	s.env = append(s.env, "OAUTH_CLIENT_ID=crm-client", "OAUTH_CLIENT_SECRET="+crmSecret, "OAUTH_AUTH_STYLE=header",
		"OAUTH_TOKEN_URL="+crm.url+"/oauth2/token", "OAUTH_AUTH_URL="+crm.url+"/oauth2/auth", "API_BASE_URL="+crm.url)
	s.migrate()
	if r := run(t, bin, "tokenctl", s.env, mailSecret+"\n", "provider", "add", "--name", "mail",
		"--token-url", mail.url+"/oauth2/token", "--auth-url", mail.url+"/oauth2/auth", "--client-id", "mail-client",
		"--auth-style", "params", "--api-base-url", mail.url, "--scopes", "api"); r.code != 0 {
		t.Fatalf("tokenctl provider add: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	grant := run(t, bin, "sandbox", append(baseEnv(), "SANDBOX_CLIENT_SECRET="+crmSecret), "", "grant", "--url", crm.url, "--client-id", "crm-client")
	if grant.code != 0 {
		t.Fatalf("sandbox grant: exit %d: %s", grant.code, grant.stderr)
	}
	if r := run(t, bin, "tokenctl", s.env, grant.stdout, "import", "--connection", "acme"); r.code != 0 {
		t.Fatalf("tokenctl import: exit %d: %s", r.code, r.stderr)
	}
	rotate = func() (int64, time.Time, time.Time) {
		// The rotation: mail refuses the old secret from now on...
		if err := os.WriteFile(secretFile, []byte(mailSecret2+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		rejectedBefore := mail.stats().RefreshRejected // the apps' start-up checks
		rotated := time.Now()
		if err := mail.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		// Until a refresh with the old secret has been refused: the window
		// this test is about.
		waitfor.Until(t, 4*lifetime, "mail never refused the old secret: the rotation was not exercised", func() bool {
			return mail.stats().RefreshRejected > rejectedBefore
		})

		// ... and the processes are given the new one.
		if r := run(t, bin, "tokenctl", s.env, mailSecret2+"\n", "provider", "update", "--name", "mail", "--client-secret-stdin"); r.code != 0 {
			t.Fatalf("tokenctl provider update: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
		return rejectedBefore, rotated, time.Now()
	}
	return s, crm, mail, rotate
}

// twoConnectionLoad calls each connection's resource (two callers each)
// and posts an event for each every 100 ms, until finish.
type twoConnectionLoad struct {
	mu     sync.Mutex
	calls  []call
	events []int64
	evBad  []string
	stop   chan struct{}
	wg     sync.WaitGroup
}

func startTwoConnectionLoad(s *stack, conns ...string) *twoConnectionLoad {
	l := &twoConnectionLoad{stop: make(chan struct{})}
	for _, conn := range conns {
		for range 2 {
			l.wg.Go(func() {
				for {
					select {
					case <-l.stop:
						return
					default:
					}
					start := time.Now()
					code, body := s.do(http.MethodGet, "/connections/"+conn+"/resource", "")
					l.mu.Lock()
					l.calls = append(l.calls, call{conn: conn, start: start, end: time.Now(), code: code, body: body})
					l.mu.Unlock()
					time.Sleep(10 * time.Millisecond)
				}
			})
		}
		l.wg.Go(func() {
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for n := 0; ; n++ {
				select {
				case <-l.stop:
					return
				case <-tick.C:
				}
				code, body := s.do(http.MethodPost, "/connections/"+conn+"/events", fmt.Sprintf(`{"n":%d}`, n))
				var r struct {
					EventID int64 `json:"event_id"`
				}
				l.mu.Lock()
				if code == http.StatusAccepted && json.Unmarshal([]byte(body), &r) == nil && r.EventID > 0 {
					l.events = append(l.events, r.EventID)
				} else {
					l.evBad = append(l.evBad, fmt.Sprintf("%s: %d %s", conn, code, body))
				}
				l.mu.Unlock()
			}
		})
	}
	return l
}

func (l *twoConnectionLoad) finish() {
	close(l.stop)
	l.wg.Wait()
}

// checkCallsAcrossRotation: no call started after the switch failed;
// before it, only globex's (mail's) could fail, and only after the
// rotation.
func checkCallsAcrossRotation(t *testing.T, calls []call, rotated, switched time.Time) (ok, windowFailed int, perConn map[string]int) {
	perConn = map[string]int{}
	for _, c := range calls {
		if c.code == http.StatusOK {
			ok++
			perConn[c.conn]++
			continue
		}
		switch {
		case !c.start.Before(switched):
			t.Errorf("%s: call at +%v after the switch failed: %d %s", c.conn, c.start.Sub(switched).Round(time.Millisecond), c.code, c.body)
		case c.conn == "globex" && c.end.After(rotated):
			windowFailed++
		default:
			t.Errorf("%s: call at %v before the rotation failed: %d %s", c.conn, c.start.Sub(rotated).Round(time.Millisecond), c.code, c.body)
		}
	}
	return ok, windowFailed, perConn
}
