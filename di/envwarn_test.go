package di

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
)

func TestKnownVarsComeFromTheConfigStructs(t *testing.T) {
	for _, name := range []string{"DATABASE_URL", "OAUTH_CLIENT_SECRET", "OAUTH_AUTH_STYLE", "TOKEN_REFRESH_SKEW",
		"TOKEN_ENCRYPTION_KEYS", "DB_MAX_CONNS", "MIGRATE_ON_START", "API_TIMEOUT", "WORKER_JOB_TIMEOUT", "LOG_FORMAT", "METRICS_CONNECTION_LABEL"} {
		if _, ok := slices.BinarySearch(knownVars, name); !ok {
			t.Errorf("%s is not among the known settings %v", name, knownVars)
		}
	}
	for _, p := range []string{"OAUTH_", "TOKEN_", "DB_", "DATABASE_", "API_", "HTTP_", "WORKER_", "LOG_", "METRICS_", "MIGRATE_"} {
		if !slices.Contains(ourPrefixes, p) {
			t.Errorf("prefix %s missing from %v", p, ourPrefixes)
		}
	}
}

func TestEnvWarnings(t *testing.T) {
	environ := []string{
		"OAUTH_CLIENT_SECERT=value-secret-1", // transposed letters
		"TOKEN_REFRESH_SKWE=5s",
		"DB_MAX_CONN=4",
		"log_level=debug", // names are case-sensitive
		"OAUTH_CLIENT_ID=id", "OAUTH_CLIENT_SECRET=", "DATABASE_URL=postgres://db/x", "TOKEN_REFRESH_SKEW=1s",
		"API_KEY=value-secret-2", // ours by its prefix, near nothing
		"HTTP_PROXY=http://proxy:3128", "http_proxy=http://proxy:3128", "PATH=/bin", "TEST_DATABASE_URL=postgres://db/test", "HOME=/root",
		// OpenTelemetry's, read by its SDK.
		"OTEL_TRACES_EXPORTER=console", "OTEL_SERVICE_NAME=svc", "OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318", "OTEL_TRACES_SAMPLER=always_on",
	}
	want := map[string]string{
		"OAUTH_CLIENT_SECERT": "OAUTH_CLIENT_SECERT is not a tokenguard setting and is ignored; did you mean OAUTH_CLIENT_SECRET?",
		"TOKEN_REFRESH_SKWE":  "TOKEN_REFRESH_SKWE is not a tokenguard setting and is ignored; did you mean TOKEN_REFRESH_SKEW?",
		"DB_MAX_CONN":         "DB_MAX_CONN is not a tokenguard setting and is ignored; did you mean DB_MAX_CONNS?",
		"log_level":           "log_level is not a tokenguard setting and is ignored; did you mean LOG_LEVEL?",
		"API_KEY":             "API_KEY is not a tokenguard setting and is ignored",
		"OAUTH_CLIENT_SECRET": "OAUTH_CLIENT_SECRET is empty: the token endpoint will reject a confidential client (invalid_client)",
	}
	got := map[string]string{}
	for _, w := range envWarnings(environ, true) {
		got[w.Variable] = w.Message
		if strings.Contains(w.Message, "value-secret") {
			t.Errorf("a warning shows a value: %q", w.Message)
		}
	}
	for v, msg := range want {
		if got[v] != msg {
			t.Errorf("warning about %s = %q, want %q", v, got[v], msg)
		}
	}
	if len(got) != len(want) {
		t.Errorf("warnings %v, want only %v", got, want)
	}

	// Unset counts as empty; a set secret, or a command that sends none,
	// gets no warning.
	if ws := envWarnings([]string{"DATABASE_URL=x"}, true); len(ws) != 1 || ws[0].Variable != "OAUTH_CLIENT_SECRET" {
		t.Errorf("no secret: %v", ws)
	}
	if ws := envWarnings([]string{"OAUTH_CLIENT_SECRET=s"}, true); len(ws) != 0 {
		t.Errorf("secret set: %v", ws)
	}
	if ws := envWarnings([]string{"DATABASE_URL=x"}, false); len(ws) != 0 {
		t.Errorf("secret not needed: %v", ws)
	}
}

// An app prints the warnings as log lines once it has a logger, and as
// plain lines before a configuration error, which a misspelt name often
// causes.
func TestRunWarnsAboutTheEnvironment(t *testing.T) {
	var stderr bytes.Buffer
	environ := []string{"DATABASE_URL=postgres://db/x", "OAUTH_CLIENT_SECERT=value-secret-1", "LOG_FORMAT=text"}
	code := Run("worker", environ, &stderr, func(context.Context, AppConfig, *slog.Logger) error { return nil })
	out := stderr.String()
	if code != 0 || !strings.Contains(out, `level=WARN msg="OAUTH_CLIENT_SECERT is not a tokenguard setting and is ignored; did you mean OAUTH_CLIENT_SECRET?" app=worker`) ||
		!strings.Contains(out, `msg="OAUTH_CLIENT_SECRET is empty`) || strings.Contains(out, "value-secret") {
		t.Errorf("exit %d, stderr:\n%s", code, out)
	}

	stderr.Reset()
	code = Run("server", []string{"DATABSE_URL=postgres://db/x"}, &stderr, func(context.Context, AppConfig, *slog.Logger) error { return nil })
	want := "server: warning: DATABSE_URL is not a tokenguard setting and is ignored; did you mean DATABASE_URL?\n" +
		"server: warning: OAUTH_CLIENT_SECRET is empty: the token endpoint will reject a confidential client (invalid_client)\n" +
		"server: DATABASE_URL is required\n"
	if code != 2 || stderr.String() != want {
		t.Errorf("exit %d, stderr:\n%s\nwant\n%s", code, stderr.String(), want)
	}
}
