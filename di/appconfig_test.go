package di

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestAppConfigFromEnv(t *testing.T) {
	base := []string{"DATABASE_URL=postgres://u:pw@127.0.0.1:5432/db?sslmode=disable"}
	c, err := AppConfigFromEnv(base)
	if err != nil || c.APITimeout != 10*time.Second || c.WorkerConcurrency != 10 || c.WorkerJobTimeout != time.Minute || c.HTTPAddr != "127.0.0.1:8080" ||
		c.LogFormat != "json" || c.MetricsAddr != "" || c.MetricsConnectionLabel {
		t.Fatalf("defaults: %+v, %v", c.AppSettings, err)
	}
	for env, want := range map[string]string{
		"API_TIMEOUT=fast":                 `API_TIMEOUT is malformed: unable to parse duration: time: invalid duration "fast"`,
		"API_TIMEOUT=0s":                   "API_TIMEOUT must be positive",
		"WORKER_CONCURRENCY=0":             "WORKER_CONCURRENCY must be at least 1",
		"LOG_LEVEL=loud":                   `LOG_LEVEL must be debug, info, warn or error, got "loud"`,
		"LOG_FORMAT=xml":                   `LOG_FORMAT must be json or text, got "xml"`,
		"METRICS_ADDR=9090":                `METRICS_ADDR must be host:port, got "9090"`,
		"METRICS_CONNECTION_LABEL=maybe":   `METRICS_CONNECTION_LABEL is malformed: strconv.ParseBool: parsing "maybe": invalid syntax`,
		"DATABASE_URL=postgres://u:pw@h:x": "DATABASE_URL is malformed: invalid port",
	} {
		_, err := AppConfigFromEnv(append(base, env))
		var ce *ConfigError
		if !errors.As(err, &ce) || err.Error() != want {
			t.Errorf("%s: err = %v, want ConfigError %q", env, err, want)
		}
	}
	if _, err := AppConfigFromEnv(nil); err == nil || err.Error() != "DATABASE_URL is required" {
		t.Errorf("no DATABASE_URL: %v", err)
	}
	if err := (AppConfig{Config: c.Config}).requireAPI(); err == nil || err.Error() != "API_BASE_URL is required" {
		t.Errorf("requireAPI = %v", err)
	}
}

func TestUserAgent(t *testing.T) {
	if ua := UserAgent("worker"); !regexp.MustCompile(`^tokenguard-worker/\S+$`).MatchString(ua) {
		t.Errorf("UserAgent = %q", ua)
	}
	Version = "v1.2.3"
	defer func() { Version = "" }()
	if ua := UserAgent("batch"); ua != "tokenguard-batch/v1.2.3" {
		t.Errorf("UserAgent = %q", ua)
	}
}

func TestRunLogsSayWhichProcess(t *testing.T) {
	for _, format := range []string{"json", "text"} {
		var out bytes.Buffer
		code := Run("worker", []string{"DATABASE_URL=postgres://u@127.0.0.1/db", "OAUTH_CLIENT_SECRET=s", "LOG_FORMAT=" + format}, &out,
			func(_ context.Context, _ AppConfig, log *slog.Logger) error {
				log.Info("token refresh", "connection", "acme")
				return nil
			})
		line := strings.TrimSpace(out.String())
		pid := strconv.Itoa(os.Getpid())
		switch format {
		case "json":
			var rec map[string]any
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				t.Fatalf("json: %v: %q", err, line)
			}
			if rec["app"] != "worker" || rec["pid"] != float64(os.Getpid()) || rec["msg"] != "token refresh" || rec["connection"] != "acme" {
				t.Errorf("json line %q", line)
			}
		case "text":
			if !strings.Contains(line, "app=worker pid="+pid+" connection=acme") || !strings.Contains(line, `msg="token refresh"`) {
				t.Errorf("text line %q", line)
			}
		}
		if code != 0 {
			t.Errorf("exit %d", code)
		}
	}
}
