package e2e

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
	for lines.Scan() { // the banner ends with the second provider's import
		banner.WriteString(lines.Text() + "\n")
		if strings.Contains(lines.Text(), "--provider sandbox") {
			break
		}
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
	for _, want := range []string{"OAUTH_CLIENT_SECRET=", "OAUTH_REDIRECT_URL=", "OAUTH_TOKEN_URL=" + url, "sandbox grant --url " + url,
		"PUBLIC_URL=", "CONNECT_RETURN_URLS=", "OAUTH_USERINFO_URL=" + url + "/userinfo", url + "/resource", url + "/stats"} {
		if !strings.Contains(banner.String(), want) {
			t.Errorf("the sandbox's banner lacks %q:\n%s", want, banner.String())
		}
	}
}

// testReadmeConnectSession runs the documented connect-session example
// (docs/http-api.md) as written, with the settings it names (PUBLIC_URL, CONNECT_RETURN_URLS,
// OAUTH_USERINFO_URL) as the sandbox prints them, on an unmigrated
// database first (tokenctl says to migrate), then follows its connect_url
// like a browser back to the return_to.
func testReadmeConnectSession(t *testing.T, bin string) {
	readme, err := os.ReadFile("../../../docs/http-api.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "**Connecting an account.**")
	_, block, ok2 := strings.Cut(section, "```sh\n")
	block, rest, ok3 := strings.Cut(block, "```")
	_, redeemBlock, ok4 := strings.Cut(rest, "```sh\n")
	redeemBlock, _, ok5 := strings.Cut(redeemBlock, "```")
	if !ok || !ok2 || !ok3 || !ok4 || !ok5 || !strings.Contains(block, "connect-sessions") || !strings.Contains(redeemBlock, "connect-results") {
		t.Fatalf("no connect-session and redeem examples in docs/http-api.md")
	}
	s := newStack(t, bin, stackOpts{lifetime: lifetime, skew: skew})
	s.env = append(s.env, "PUBLIC_URL=http://"+s.addr, "CONNECT_RETURN_URLS=https://app.example.com/",
		"OAUTH_USERINFO_URL="+s.sb.URL+"/userinfo")
	dir := t.TempDir()
	if err := os.Symlink(bin, filepath.Join(dir, "bin")); err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "key")
	example := func() (string, string, error) {
		// As written, then the key it made kept for the redeem example.
		cmd := exec.Command("bash", "-euo", "pipefail", "-c", block+`printf %s "$KEY" >`+keyFile+"\n")
		cmd.Dir, cmd.Env = dir, s.env
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return stdout.String(), stderr.String(), err
	}

	// Before tokenctl migrate, the example's first command says what to do.
	if _, stderr, err := example(); err == nil || !strings.Contains(stderr, "run `tokenctl migrate` first") {
		t.Fatalf("the example on an unmigrated database: %v\n%s", err, stderr)
	}
	s.migrate()
	server := s.start("server")
	s.waitHealthy(server)
	stdout, stderr, err := example()
	if err != nil {
		t.Fatalf("the documented example: %v\n%s%s", err, stdout, stderr)
	}
	var created struct {
		ConnectURL string `json:"connect_url"`
	}
	if err := json.Unmarshal([]byte(stdout), &created); err != nil || !strings.HasPrefix(created.ConnectURL, "http://"+s.addr+"/oauth/connect?session=tgs_") {
		t.Fatalf("the documented example printed %q (%v)", stdout, err)
	}
	resp, body := browser(t, s, created.ConnectURL, "", "")
	back := returned(resp)
	if back == nil || back.Scheme+"://"+back.Host+back.Path != "https://app.example.com/integrations" ||
		back.Query().Get("connection") != "acme" || back.Query().Get("status") != "pending" || !strings.HasPrefix(back.Query().Get("result"), "tgr_") {
		t.Fatalf("after consent: %s Location %q %s", resp.Status, resp.Header.Get("Location"), body)
	}
	if r := run(t, bin, "tokenctl", s.env, "", "status", "--connection", "acme"); r.code == 0 && strings.Contains(r.stdout, "active") {
		t.Errorf("tokenctl status before the redemption: the grant is stored already\n%s", r.stdout)
	}
	key, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", redeemBlock)
	cmd.Dir, cmd.Env = dir, append(slices.Clone(s.env), "KEY="+string(key), "RESULT="+back.Query().Get("result"))
	out, err := cmd.Output()
	var r redeemed
	if err != nil || json.Unmarshal(out, &r) != nil || r.Connection != "acme" || r.Account != "sandbox-user" {
		t.Fatalf("the documented redeem example: %v %s", err, out)
	}
	if r := run(t, bin, "tokenctl", s.env, "", "status", "--connection", "acme"); r.code != 0 || !strings.Contains(r.stdout, "active") {
		t.Errorf("tokenctl status after the connect flow: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// The same link again: an HTML page for the browser, not JSON.
	resp, body = browser(t, s, created.ConnectURL, "", "")
	if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") || strings.HasPrefix(body, "{") {
		t.Errorf("a used connect link: %s %s %.200s", resp.Status, resp.Header.Get("Content-Type"), body)
	}
	s.stop(server)
}
