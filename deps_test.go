package tokenguard_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// embeddingProgram uses what an embedding application uses: Migrate, New,
// Token, Client, Run, Close.
const embeddingProgram = `package main

import (
	"context"
	"os"

	"golang.org/x/oauth2"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard"
	/*IMPORT*/
)

func main() {
	ctx := context.Background()
	db, _ := gorm.Open(postgres.Open(os.Getenv("DATABASE_URL")), &gorm.Config{})
	_ = tokenguard.Migrate(ctx, db)
	tokens, _ := tokenguard.New(db, &oauth2.Config{} /*OPTION*/)
	go tokens.Run(ctx)
	_, _ = tokens.Token(ctx, "acme")
	_ = tokens.Client(ctx, "acme")
	_ = tokens.Close(ctx)
}
`

// unwanted reports the packages an application that does not ask for
// metrics should not link: a Prometheus client, lib/pq (tokenguard runs
// on the application's driver), a golang-migrate database driver other
// than the pgx one Migrate uses.
func unwanted(deps []string) []string {
	var bad []string
	for _, p := range deps {
		migrateDriver := strings.HasPrefix(p, "github.com/golang-migrate/migrate/v4/database/") &&
			p != "github.com/golang-migrate/migrate/v4/database/pgx/v5" && p != "github.com/golang-migrate/migrate/v4/database/multistmt"
		if strings.HasPrefix(p, "github.com/prometheus/") || strings.HasPrefix(p, "github.com/lib/pq") || migrateDriver {
			bad = append(bad, p)
		}
	}
	return bad
}

// otelSDK reports the OpenTelemetry packages beyond the API (and its HTTP
// instrumentation) an application links: the SDK, exporters, their gRPC
// and protobuf. Which of them record and send spans is the application's
// choice; tokenguard uses only the API.
func otelSDK(deps []string) []string {
	var bad []string
	for _, p := range deps {
		for _, prefix := range []string{"go.opentelemetry.io/otel/sdk", "go.opentelemetry.io/otel/exporters/",
			"go.opentelemetry.io/contrib/exporters/", "go.opentelemetry.io/proto/", "google.golang.org/grpc"} {
			if strings.HasPrefix(p, prefix) {
				bad = append(bad, p)
				break
			}
		}
	}
	return bad
}

// An application that embeds tokenguard without metrics links no
// Prometheus client, no lib/pq and no unused golang-migrate driver
// (go list -deps of a module outside this one). The control asks for
// metrics (prom.WithMetrics) and does link Prometheus.
func TestEmbeddingLinksNoPrometheusNorLibPQ(t *testing.T) {
	plain := strings.NewReplacer("/*IMPORT*/", "", "/*OPTION*/", "").Replace(embeddingProgram)
	deps := goListDeps(t, outsideModule(t, plain))
	if bad := unwanted(deps); len(bad) != 0 {
		t.Fatalf("an application without metrics links %v", bad)
	}
	t.Logf("%d packages outside the standard library", len(deps))

	withMetrics := strings.NewReplacer(
		"/*IMPORT*/", "\"github.com/prometheus/client_golang/prometheus\"\n\t\"github.com/tokenguard/tokenguard/prom\"",
		"/*OPTION*/", ", prom.WithMetrics(prometheus.NewRegistry())").Replace(embeddingProgram)
	metricsDeps := goListDeps(t, outsideModule(t, withMetrics))
	if bad := unwanted(metricsDeps); len(bad) == 0 {
		t.Fatal("control: an application with prom.WithMetrics links no Prometheus client: the check sees nothing")
	}
	t.Logf("%d with prom.WithMetrics", len(metricsDeps))
}

// An application that embeds tokenguard links OpenTelemetry's API (its
// spans go to the global provider, or to WithTracerProvider's) but not
// its SDK nor an exporter. The control passes an SDK provider and does
// link the SDK.
func TestEmbeddingLinksNoOpenTelemetrySDK(t *testing.T) {
	plain := strings.NewReplacer("/*IMPORT*/", "", "/*OPTION*/", "").Replace(embeddingProgram)
	deps := goListDeps(t, outsideModule(t, plain))
	if bad := otelSDK(deps); len(bad) != 0 {
		t.Fatalf("an application links %v", bad)
	}
	if !slices.Contains(deps, "go.opentelemetry.io/otel/trace") {
		t.Fatal("an application does not link the OpenTelemetry API: no span is recorded")
	}
	withSDK := strings.NewReplacer(
		"/*IMPORT*/", "sdktrace \"go.opentelemetry.io/otel/sdk/trace\"",
		"/*OPTION*/", ", tokenguard.WithTracerProvider(sdktrace.NewTracerProvider())").Replace(embeddingProgram)
	if bad := otelSDK(goListDeps(t, outsideModule(t, withSDK))); len(bad) == 0 {
		t.Fatal("control: an application with an SDK provider links no SDK: the check sees nothing")
	}
}

// goListDeps lists the packages outside the standard library the main
// package in dir links.
func goListDeps(t *testing.T, dir string) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go list -deps: %v\n%s", err, stderr)
	}
	return strings.Fields(string(out))
}

// toolModules reports the modules of tokenguard's tools in a module
// graph: the console's browser test's Chromium driver, the conformance
// suite's OpenID provider, the Nango-style peer's Redis client, the bench
// report's benchfmt. The tools are a module of their own (tools/), and
// only it requires them.
func toolModules(mods []string) []string {
	var bad []string
	for _, m := range mods {
		for _, prefix := range []string{"github.com/chromedp/", "github.com/zitadel/", "github.com/redis/go-redis/", "golang.org/x/perf"} {
			if strings.HasPrefix(m, prefix) {
				bad = append(bad, m)
				break
			}
		}
	}
	return bad
}

// An application that requires tokenguard has none of the tools'
// modules in its module graph (go list -m all of a module outside this
// one). The control points the application's replace at a copy of this
// go.mod that requires chromedp, as this go.mod did when the tools were
// part of this module, and the check finds it.
func TestOutsideModuleGraphHasNoToolModules(t *testing.T) {
	plain := strings.NewReplacer("/*IMPORT*/", "", "/*OPTION*/", "").Replace(embeddingProgram)
	mods := goListModules(t, outsideModule(t, plain))
	if bad := toolModules(mods); len(bad) != 0 {
		t.Fatalf("an application requiring tokenguard has %v in its module graph", bad)
	}
	t.Logf("%d modules in the graph", len(mods))

	// The control's tokenguard: this go.mod with chromedp required, and
	// the sums of both modules (go list -m reads no package of it).
	gomod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	version := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "github.com/chromedp/chromedp")
	version.Dir = "tools"
	version.Env = append(os.Environ(), "GOWORK=off")
	v, err := version.Output()
	if err != nil {
		t.Fatalf("go list -m github.com/chromedp/chromedp in tools: %v", err)
	}
	var sum []byte
	for _, f := range []string{"go.sum", filepath.Join("tools", "go.sum")} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		sum = append(sum, b...)
	}
	lib := t.TempDir()
	gomod = append(gomod, "\nrequire github.com/chromedp/chromedp "+strings.TrimSpace(string(v))+"\n"...)
	if err := os.WriteFile(filepath.Join(lib, "go.mod"), gomod, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(lib, "go.sum"), sum, 0o644); err != nil {
		t.Fatal(err)
	}
	if bad := toolModules(goListModules(t, outsideModuleAt(t, lib, plain, nil))); !slices.Contains(bad, "github.com/chromedp/chromedp") {
		t.Fatalf("control: with chromedp required by tokenguard's go.mod, the check finds %v", bad)
	}
}

// goListModules lists the module paths of the module graph in dir.
func goListModules(t *testing.T, dir string) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Path}}", "all")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go list -m all: %v\n%s", err, stderr)
	}
	return strings.Fields(string(out))
}
