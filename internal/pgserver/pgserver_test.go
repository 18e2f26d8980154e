package pgserver

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestParseSkip(t *testing.T) {
	got, err := ParseSkip(" env, docker,,local ")
	if err != nil || strings.Join(got, ",") != "env,docker,local" {
		t.Fatalf("got %v, %v", got, err)
	}
	if _, err := ParseSkip("env,dokcer"); err == nil || !strings.Contains(err.Error(), `"dokcer"`) {
		t.Fatalf("a misspelt step must be refused, got %v", err)
	}
}

func TestFindWithNothingLeftSaysWhatToInstall(t *testing.T) {
	_, err := Find(context.Background(), Options{URLVar: "TEST_DATABASE_URL", Skip: steps})
	if err == nil {
		t.Fatal("every step skipped, yet a server was found")
	}
	for _, want := range []string{"apt-get install postgresql", "docker.io", "127.0.0.1:5432", "TEST_DATABASE_URL", "initdb: skipped"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
}

func TestWithDatabase(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://postgres@127.0.0.1:5432/test?sslmode=disable": "postgres://postgres@127.0.0.1:5432/tg_x?sslmode=disable",
		"host=127.0.0.1 user=postgres dbname=test":                "host=127.0.0.1 user=postgres dbname=test dbname=tg_x",
	} {
		if got := withDatabase(in, "tg_x"); got != want {
			t.Errorf("withDatabase(%q) = %q, want %q", in, got, want)
		}
	}
}

// A local server that allows fewer client connections than asked for is
// passed over, with the reason and the setting that would let it serve.
func TestFindPassesOverASmallLocalServer(t *testing.T) {
	if err := Ping(context.Background(), LocalURL, 3*time.Second); err != nil {
		t.Skipf("no Postgres on 127.0.0.1:5432: %v", err)
	}
	only := []string{StepEnv, StepDocker, StepInitdb}
	if _, err := Find(context.Background(), Options{URLVar: "TEST_DATABASE_URL", Skip: only, MinConnections: 1}); err != nil {
		t.Fatalf("a local server that allows one client was passed over: %v", err)
	}
	var notes []string
	_, err := Find(context.Background(), Options{URLVar: "TEST_DATABASE_URL", Skip: only, MinConnections: 1 << 20,
		Note: func(s string) { notes = append(notes, s) }})
	if err == nil {
		t.Fatal("a local server that allows fewer clients than asked for was taken")
	}
	if len(notes) != 1 || !strings.Contains(notes[0], "client connections") || !strings.Contains(notes[0], "max_connections = ") {
		t.Fatalf("notes %q do not say why and what to set", notes)
	}
}
