package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// clientsDir is where the Python and TypeScript clients live.
var clientsDir = filepath.Join("..", "..", "..", "clients")

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

// testClients runs the Python and TypeScript clients' own tests (unittest,
// node --test) with the real interpreters against the bundled server and
// the strict sandbox: 3 s tokens handed out until 1 s before expiry.
func testClients(t *testing.T, bin string) {
	s := newStack(t, bin, stackOpts{lifetime: lifetime, skew: skew})
	s.migrate()
	s.importGrant("acme")
	server := s.start("server")
	s.waitHealthy(server)
	table, _ := filepath.Abs(filepath.Join(clientsDir, "..", "testdata", "hostile_paths.json"))
	env := append(os.Environ(), "TOKENGUARD_URL=http://"+s.addr, "TOKENGUARD_API_KEY="+s.key, "SANDBOX_URL="+s.sb.URL,
		"TOKENGUARD_HOSTILE_PATHS="+table)
	// One after the other: each runs a forced refresh, and the server
	// allows one per half the token's lifetime.
	t.Run("Python", func(t *testing.T) {
		// Installed into a fresh virtualenv from its folder, offline, and
		// tested from elsewhere: the tests import the installed package.
		venv := filepath.Join(t.TempDir(), "venv")
		runClientTests(t, env, t.TempDir(), interpreter(t, "python3"), "-m", "venv", venv)
		src, _ := filepath.Abs(filepath.Join(clientsDir, "python"))
		runClientTests(t, env, t.TempDir(), filepath.Join(venv, "bin", "pip"), "install", "--no-index", "--no-build-isolation", src)
		tests := filepath.Join(src, "tests")
		runClientTests(t, env, t.TempDir(), filepath.Join(venv, "bin", "python"), "-m", "unittest", "discover", "-v", "-s", tests, "-t", tests)
	})
	t.Run("TypeScript", func(t *testing.T) {
		runClientTests(t, env, filepath.Join(clientsDir, "typescript"), interpreter(t, "node"), "--test", "test/")
		testInstalledTypeScript(t, env)
	})
	st := s.sb.Stats()
	if st.RefreshReuse != 0 {
		t.Errorf("refresh-token reuse at the provider: %d", st.RefreshReuse)
	}
	s.stop(server)
}

// testInstalledTypeScript installs the TypeScript client from its folder
// into a fresh npm project, offline, and runs its tests there against the
// installed package.
func testInstalledTypeScript(t *testing.T, env []string) {
	t.Helper()
	npm := interpreter(t, "npm")
	src, _ := filepath.Abs(filepath.Join(clientsDir, "typescript"))
	project := t.TempDir()
	if err := os.WriteFile(filepath.Join(project, "package.json"), []byte(`{"name": "app", "version": "1.0.0", "type": "module", "private": true}`), 0o644); err != nil {
		t.Fatal(err)
	}
	env = append(env, "npm_config_cache="+filepath.Join(project, ".npm"))
	runClientTests(t, env, project, npm, "pack", "--pack-destination", project, src)
	runClientTests(t, env, project, npm, "install", "--offline", "--no-audit", "--no-fund", "./tokenguard-client-1.1.0.tgz")
	if err := os.MkdirAll(filepath.Join(project, "test"), 0o755); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(src, "test", "*.test.mjs"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		installed := strings.ReplaceAll(string(b), `from "../index.mjs"`, `from "@tokenguard/client"`)
		if err := os.WriteFile(filepath.Join(project, "test", filepath.Base(f)), []byte(installed), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	runClientTests(t, env, project, interpreter(t, "node"), "--test", "test/")
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

// testTokenAPI: the server binary hands out the token (never the refresh
// token, never cached by HTTP caches, never logged), refreshes after a 401
// once per stale version however many callers report it, proxies calls,
// and serves its OpenAPI document.
func testTokenAPI(t *testing.T, bin string) {
	s := newStack(t, bin, stackOpts{lifetime: time.Hour, skew: skew})
	s.migrate()
	s.importGrant("acme")
	server := s.start("server")
	s.waitHealthy(server)

	tokenOf := func(method, path, body string) (tok struct {
		AccessToken string `json:"access_token"`
		Version     int64  `json:"version"`
	}) {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+s.addr+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+s.key)
		resp, err := s.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Cache-Control") != "no-store" ||
			json.Unmarshal(b, &tok) != nil || tok.AccessToken == "" || strings.Contains(string(b), "refresh_token") {
			t.Fatalf("%s %s: %d %v %s", method, path, resp.StatusCode, resp.Header, b)
		}
		return tok
	}
	atAPI := func(token string) int {
		req, _ := http.NewRequest(http.MethodGet, s.sb.URL+"/resource", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := s.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	old := tokenOf("GET", "/connections/acme/token", "")
	if atAPI(old.AccessToken) != http.StatusOK {
		t.Fatal("the handed-out token is refused by the API")
	}
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			if got := tokenOf("POST", "/connections/acme/token/refresh", fmt.Sprintf(`{"stale_version":%d}`, old.Version)); got.Version != old.Version+1 {
				t.Errorf("after a 401 on version %d: version %d", old.Version, got.Version)
			}
		})
	}
	wg.Wait()
	fresh := tokenOf("GET", "/connections/acme/token", "")
	if st := s.sb.Stats(); st.Refreshes != 1 || st.RefreshReuse != 0 || atAPI(old.AccessToken) != http.StatusUnauthorized || atAPI(fresh.AccessToken) != http.StatusOK {
		t.Errorf("10 reports of one stale version: %d refreshes, %d reuse; want one refresh, the old token revoked", st.Refreshes, st.RefreshReuse)
	}
	if code, body := s.do("GET", "/connections/acme/proxy/resource", ""); code != http.StatusOK || !strings.Contains(body, `"ok":true`) {
		t.Errorf("proxy: %d %s", code, body)
	}
	if code, body := s.doWith("", "GET", "/openapi.json", ""); code != http.StatusOK || !strings.Contains(body, `"/connections/{name}/token"`) {
		t.Errorf("openapi.json: %d %.200s", code, body)
	}
	s.stop(server)
	if logs := server.Stderr(); strings.Contains(logs, old.AccessToken) || strings.Contains(logs, fresh.AccessToken) {
		t.Error("the server logged an access token")
	}
}
