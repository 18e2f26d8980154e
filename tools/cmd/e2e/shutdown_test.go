package e2e

import (
	"context"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokenguard/tokenguard/internal/sandbox"
)

// testSIGTERMDuringRefresh: the server's refresh is held at the provider,
// its caller has gone, and the server gets SIGTERM. The server waits for
// the refresh (tokenguard's Close, before the pool closes), stores the
// rotated token and exits 0; the next refresh, by another process, spends
// that token: nothing is reused, the grant lives.
//
// The same scenario with a process that does not wait (SIGKILL here, as an
// exit that skips Close) loses the rotated token: the next refresh
// presents the dead one, the provider answers invalid_grant and revokes
// the grant. That run shows what the first one guards against.
func testSIGTERMDuringRefresh(t *testing.T, bin string) {
	for _, c := range []struct {
		name string
		sig  syscall.Signal
	}{{"SIGTERM", syscall.SIGTERM}, {"SIGKILL", syscall.SIGKILL}} {
		t.Run(c.name, func(t *testing.T) {
			reuse, version, status := refreshHeldAtSignal(t, bin, c.sig)
			switch c.sig {
			case syscall.SIGTERM:
				if reuse != 0 || version != 3 || status != "active" {
					t.Fatalf("after SIGTERM: %d reuse, version %d, %s; want 0, 3 (two refreshes), active", reuse, version, status)
				}
			case syscall.SIGKILL:
				if reuse != 1 || status != "needs_reauth" {
					t.Fatalf("after SIGKILL: %d reuse, %s; want the rotated token lost: 1 reuse, needs_reauth", reuse, status)
				}
			}
		})
	}
}

// refreshHeldAtSignal runs the scenario and returns the provider's reuse
// count and the stored version and status after the next refresh.
func refreshHeldAtSignal(t *testing.T, bin string, sig syscall.Signal) (reuse int64, version int64, status string) {
	held := newHeldRefresh()
	held.then = sandbox.FaultNone // once released, the provider rotates
	// A server that leaves with its request unresolved (SIGKILL) leaves its
	// lease to be abandoned a second after the answer deadline.
	const answerDeadline = 2 * time.Second
	s := newStack(t, bin, stackOpts{lifetime: lifetime, skew: skew, fault: held.fault,
		extraEnv: []string{"TOKEN_ANSWER_DEADLINE=" + answerDeadline.String()}})
	t.Cleanup(held.let)
	s.migrate()
	const conn = "acme"
	granted := s.importGrant(conn)
	server := s.start("server")
	s.waitHealthy(server)
	waitChecked(t, server) // its start-up probe is not the refresh to hold

	// The token is due; a request makes the server refresh it, and gives
	// up while the provider holds the refresh.
	time.Sleep(time.Until(granted.Add(lifetime - skew + 200*time.Millisecond)))
	held.armed.Store(true)
	reqCtx, giveUp := context.WithCancel(context.Background())
	answered := make(chan struct{})
	go func() {
		defer close(answered)
		req, _ := http.NewRequestWithContext(reqCtx, http.MethodGet, "http://"+s.addr+"/connections/"+conn+"/resource", nil)
		req.Header.Set("Authorization", "Bearer "+s.key)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	select {
	case <-held.hit:
	case <-time.After(5 * time.Second):
		t.Fatal("no refresh reached the provider")
	}
	giveUp()
	<-answered
	if err := syscall.Kill(server.Pid(), sig); err != nil {
		t.Fatal(err)
	}
	signalled := time.Now()
	if sig == syscall.SIGTERM {
		// With nothing in flight but the refresh, the server would be gone
		// by now if it did not wait for it.
		select {
		case <-server.Done():
			t.Fatalf("the server exited %d while its refresh was held", server.ExitCode())
		case <-time.After(700 * time.Millisecond):
		}
	} else {
		server.Wait()
	}
	held.let()
	select {
	case <-server.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not exit within 10 s of the signal")
	}
	if sig == syscall.SIGTERM {
		if code := server.ExitCode(); code != 0 {
			t.Fatalf("server exit %d after SIGTERM:\n%s", code, tail(server.Stderr(), 3000))
		}
		t.Logf("server exited 0 %v after SIGTERM", time.Since(signalled).Round(time.Millisecond))
	}

	// The next expiry, past the dead server's lease: another process
	// refreshes with the stored token.
	time.Sleep(lifetime + answerDeadline)
	r := run(t, bin, "batch", s.env, "")
	t.Logf("batch after the signal: exit %d", r.code)
	version, status = storedVersionStatus(t, s.dbURL, conn)
	return s.sb.Stats().RefreshReuse, version, status
}

func storedVersionStatus(t *testing.T, dbURL, conn string) (version int64, status string) {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	err = c.QueryRow(ctx, `SELECT t.version, t.status FROM tokenguard_tokens t JOIN tokenguard_connections c ON c.id = t.connection_id WHERE c.name = $1`, conn).Scan(&version, &status)
	if err != nil {
		t.Fatal(err)
	}
	return version, status
}
