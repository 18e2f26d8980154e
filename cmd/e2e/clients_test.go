package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// clientsDir is where the Python and TypeScript clients live.
var clientsDir = filepath.Join("..", "..", "clients")

// interpreter finds python3 or node. Outside CI a missing one skips the
// test with one line; under CI (CI=true) it fails it.
func interpreter(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s not found: the client tests need it in CI", name)
	}
	t.Skipf("%s not found: its client's tests are skipped (CI=true makes this a failure)", name)
	return ""
}

// TestClients runs the Python and TypeScript clients' own tests (unittest,
// node --test) with the real interpreters against the bundled server and
// the strict sandbox: 3 s tokens handed out until 1 s before expiry.
func TestClients(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds the apps and needs Postgres")
	}
	bin := buildApps(t)
	s := newStack(t, bin, stackOpts{lifetime: lifetime, skew: skew})
	s.migrate()
	s.importGrant("acme")
	server := s.start("server")
	s.waitHealthy(server)
	env := append(os.Environ(), "TOKENGUARD_URL=http://"+s.addr, "TOKENGUARD_API_KEY="+s.key, "SANDBOX_URL="+s.sb.URL)
	// One after the other: each runs a forced refresh, and the server
	// allows one per half the token's lifetime.
	t.Run("Python", func(t *testing.T) {
		runClientTests(t, env, filepath.Join(clientsDir, "python"), interpreter(t, "python3"), "-m", "unittest", "discover", "-v", "-s", "tests")
	})
	t.Run("TypeScript", func(t *testing.T) {
		runClientTests(t, env, filepath.Join(clientsDir, "typescript"), interpreter(t, "node"), "--test", "test/")
	})
	st := s.sb.Stats()
	if st.RefreshReuse != 0 {
		t.Errorf("refresh-token reuse at the provider: %d", st.RefreshReuse)
	}
	s.stop(server)
}

func runClientTests(t *testing.T, env []string, dir, interp string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, interp, args...)
	cmd.Dir = dir
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", filepath.Base(interp), args, err, out)
	}
	t.Logf("%s %v:\n%s", filepath.Base(interp), args, tail(string(out), 3000))
}
