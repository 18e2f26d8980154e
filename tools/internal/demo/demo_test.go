package demo

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// make demo, shortened: the apps as processes at two providers with
// different quirks pass with no failed call and no reuse at either, each
// provider refreshing its own connections, and the report and its page
// show both.
func TestDemoRunsTwoProviders(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the apps and needs Postgres")
	}
	bin := t.TempDir()
	args := []string{"build", "-o", bin + string(os.PathSeparator)}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, "github.com/tokenguard/tokenguard/cmd/server", "github.com/tokenguard/tokenguard/cmd/worker",
		"github.com/tokenguard/tokenguard/cmd/batch", "github.com/tokenguard/tokenguard/cmd/tokenctl")
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	// The demo's database goes on the server the tests use.
	t.Setenv("DATABASE_URL", testdb.URL(t))
	outDir := t.TempDir()
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := Run(ctx, Options{BinDir: bin, OutDir: outDir, Duration: 7 * time.Second, TokenLifetime: 2 * time.Second,
		StoredTokenLifetime: 3 * time.Second}, &out)
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	rep.PrintTable(&out)
	if !rep.OK {
		t.Fatalf("demo failed: %q\n%s", rep.Problems, out.String())
	}
	if len(rep.Providers) != 2 {
		t.Fatalf("%d providers in the report, want 2", len(rep.Providers))
	}
	for i, want := range []struct {
		name  string
		conns []string
	}{{"", []string{"acme", "globex"}}, {storedProvider, []string{"initech"}}} {
		p := rep.Providers[i]
		if p.Name != want.name || !slices.Equal(p.Connections, want.conns) {
			t.Errorf("provider %d: %q with %v, want %q with %v", i, p.Name, p.Connections, want.name, want.conns)
		}
		// Each provider refreshed its connections and served their
		// calls, from the server, the worker and the batch.
		if p.Refreshes == 0 || p.RefreshReuse != 0 {
			t.Errorf("%s: %d refreshes, %d reuse", p.Title(), p.Refreshes, p.RefreshReuse)
		}
		for _, app := range []string{"server", "worker", "batch"} {
			if p.ByAgent["tokenguard-"+app] == 0 {
				t.Errorf("%s served no call of the %s", p.Title(), app)
			}
		}
	}
	// Every refresh the apps logged is one a provider granted.
	var granted int64
	for _, p := range rep.Providers {
		granted += p.Refreshes
	}
	if logged := len(rep.Timeline.Refreshes); int64(logged) != granted {
		t.Errorf("the apps logged %d refreshes, the providers granted %d", logged, granted)
	}
	var page bytes.Buffer
	if err := rep.WriteHTML(&page); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`data-provider="OAUTH_*"`, `data-provider="sandbox-form"`, `data-lane="initech"`} {
		if !strings.Contains(page.String(), want) {
			t.Errorf("the page lacks %s", want)
		}
	}
	if t.Failed() {
		t.Logf("demo output:\n%s", out.String())
		logs, _ := filepath.Glob(filepath.Join(outDir, "*.log"))
		t.Logf("logs: %v", logs)
	}
}
