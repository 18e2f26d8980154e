package tokenguard_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/internal/sandbox"
)

// outsideProgram is an application outside this module: it imports
// tokenguard, GORM, GORM's Postgres driver and x/oauth2, and nothing else
// of ours.
const outsideProgram = `package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"os"
	"time"

	"golang.org/x/oauth2"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard"
)

func main() {
	ctx := context.Background()
	db, err := gorm.Open(postgres.Open(os.Getenv("DATABASE_URL")), &gorm.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := tokenguard.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	cfg := &oauth2.Config{
		ClientID:     os.Getenv("CLIENT_ID"),
		ClientSecret: os.Getenv("CLIENT_SECRET"),
		Endpoint:     oauth2.Endpoint{TokenURL: os.Getenv("TOKEN_URL"), AuthStyle: oauth2.AuthStyleInHeader},
	}
	tokens, err := tokenguard.New(db, cfg, tokenguard.WithSkew(time.Second))
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- tokens.Run(runCtx) }()

	var grant oauth2.Token
	if err := json.Unmarshal([]byte(os.Getenv("GRANT")), &grant); err != nil {
		log.Fatal(err)
	}
	if err := tokens.Import(ctx, "acme", &grant); err != nil {
		log.Fatal(err)
	}
	first, err := tokens.Token(ctx, "acme")
	if err != nil {
		log.Fatal(err)
	}
	time.Sleep(time.Until(first.Expiry) + 100*time.Millisecond) // due: refreshed next
	for i := 0; i < 3; i++ {
		resp, err := tokens.Client(ctx, "acme").Get(os.Getenv("API_URL") + "/resource")
		if err != nil {
			log.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		fmt.Println("call", i, resp.StatusCode)
	}
	second, err := tokens.Token(ctx, "acme")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("rotated", second.AccessToken != first.AccessToken)
	stop()
	if err := <-ran; err != nil {
		log.Fatal(err)
	}
	if err := tokens.Close(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("closed")
}
`

// A program outside the module, with its own go.mod that reaches this
// module through a replace directive and this module's go.sum (so nothing
// new is downloaded), builds and works against a test database and the
// sandbox provider: Migrate, New, Import, Token, Client, Run, Close.
func TestProgramOutsideTheModule(t *testing.T) {
	// 4 s tokens and a 1 s skew leave the three calls after the refresh 3 s
	// before the next one is due, on a loaded machine too.
	w := newWorld(t, sandbox.Options{AccessTokenLifespan: 4 * time.Second})
	dir, bin := buildOutside(t, outsideProgram)
	if imports := goList(t, dir); len(imports) != 0 {
		t.Fatalf("the program imports more of ours than the root package: %v", imports)
	}

	grant, _ := json.Marshal(w.grant(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	run := exec.CommandContext(ctx, bin)
	run.Env = append(os.Environ(), "DATABASE_URL="+w.url, "TOKEN_URL="+w.oauth.Endpoint.TokenURL,
		"CLIENT_ID="+w.oauth.ClientID, "CLIENT_SECRET="+w.oauth.ClientSecret, "API_URL="+w.srv.URL, "GRANT="+string(grant))
	var stderr strings.Builder
	run.Stderr = &stderr
	out, err := run.Output()
	if err != nil {
		t.Fatalf("the program failed: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr.String())
	}
	want := "call 0 200\ncall 1 200\ncall 2 200\nrotated true\nclosed\n"
	if string(out) != want {
		t.Fatalf("the program printed\n%s\nwant\n%s\nstderr:\n%s", out, want, stderr.String())
	}
	if st := w.provider.Stats(); st.Refreshes != 1 || st.RefreshReuse != 0 {
		t.Fatalf("provider: %d refreshes, %d reuses; want 1 and 0", st.Refreshes, st.RefreshReuse)
	}
}

// outsideModule writes program as the main package of a module of its own
// that reaches this module through a replace directive and this module's
// go.sum (so nothing new is downloaded), and returns its directory.
func outsideModule(t *testing.T, program string) string {
	t.Helper()
	return outsideModuleWith(t, program, nil)
}

// outsideModuleWith is outsideModule with more files (path: content) and
// more of this module's requirements, by module path.
func outsideModuleWith(t *testing.T, program string, files map[string]string, requires ...string) string {
	t.Helper()
	return outsideModuleAt(t, ".", program, files, requires...)
}

// outsideModuleAt is outsideModuleWith on the checkout of this module in
// root (an earlier release, say).
func outsideModuleAt(t *testing.T, root, program string, files map[string]string, requires ...string) string {
	t.Helper()
	root, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var more strings.Builder
	for _, r := range requires {
		more.WriteString("\t" + r + " " + moduleVersion(t, r) + "\n")
	}
	gomod := `module example.com/app

go 1.26

require (
	github.com/tokenguard/tokenguard v0.0.0
	github.com/prometheus/client_golang ` + moduleVersion(t, "github.com/prometheus/client_golang") + `
	go.opentelemetry.io/otel/sdk ` + moduleVersion(t, "go.opentelemetry.io/otel/sdk") + `
	golang.org/x/oauth2 ` + moduleVersion(t, "golang.org/x/oauth2") + `
	gorm.io/driver/postgres ` + moduleVersion(t, "gorm.io/driver/postgres") + `
	gorm.io/gorm ` + moduleVersion(t, "gorm.io/gorm") + `
` + more.String() + `)

replace github.com/tokenguard/tokenguard => ` + root + "\n"
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	all := map[string][]byte{"go.mod": []byte(gomod), "go.sum": sum, "main.go": []byte(program)}
	for name, content := range files {
		all[name] = []byte(content)
	}
	for name, content := range all {
		path := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, content, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// buildOutside builds program as the main package of a module of its
// own (outsideModule) and returns the module's directory and the binary.
func buildOutside(t *testing.T, program string) (dir, bin string) {
	t.Helper()
	return buildOutsideWith(t, outsideModule(t, program))
}

// buildOutsideWith builds the module in dir and returns dir and the binary.
func buildOutsideWith(t *testing.T, dir string) (string, string) {
	t.Helper()
	bin := filepath.Join(dir, "app")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build outside the module: %v\n%s", err, out)
	}
	return dir, bin
}

// moduleVersion is the version of a requirement of this module.
func moduleVersion(t *testing.T, path string) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", path).Output()
	if err != nil {
		t.Fatalf("go list -m %s: %v", path, err)
	}
	return strings.TrimSpace(string(out))
}

// goList lists the program's imports of this module other than the root
// package.
func goList(t *testing.T, dir string) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var ours []string
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "github.com/tokenguard/tokenguard/") {
			ours = append(ours, p)
		}
	}
	return ours
}
