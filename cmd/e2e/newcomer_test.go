package e2e

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tokenguard/tokenguard/internal/testdb"
)

// testSandboxFirstToken follows what the sandbox prints: the settings, and
// the one command that stores a first token.
func testSandboxFirstToken(t *testing.T, bin string) {
	sb := exec.Command(filepath.Join(bin, "sandbox"), "--addr", "127.0.0.1:0")
	stdout, err := sb.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := sb.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Process.Kill(); _ = sb.Wait() })
	url, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	url = strings.TrimSpace(url)
	var banner strings.Builder
	lines := bufio.NewScanner(stderr)
	for i := 0; i < 5 && lines.Scan(); i++ { // the banner's five lines
		banner.WriteString(lines.Text() + "\n")
	}

	env := append(os.Environ(), "DATABASE_URL="+testdb.New(t))
	grant := exec.Command(filepath.Join(bin, "sandbox"), "grant", "--url", url)
	imp := exec.Command(filepath.Join(bin, "tokenctl"), "import", "--connection", "acme")
	imp.Env = env
	if imp.Stdin, err = grant.StdoutPipe(); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	imp.Stdout, imp.Stderr = &out, &out
	if err := imp.Start(); err != nil {
		t.Fatal(err)
	}
	if err := grant.Run(); err != nil {
		t.Fatalf("sandbox grant: %v", err)
	}
	if err := imp.Wait(); err != nil || !strings.Contains(out.String(), "imported connection acme: status active") {
		t.Fatalf("tokenctl import: %v\n%s", err, out.String())
	}
	for _, want := range []string{"OAUTH_CLIENT_SECRET=", "OAUTH_REDIRECT_URL=", "OAUTH_TOKEN_URL=" + url, "sandbox grant --url " + url} {
		if !strings.Contains(banner.String(), want) {
			t.Errorf("the sandbox's banner lacks %q:\n%s", want, banner.String())
		}
	}
}
