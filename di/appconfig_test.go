package di

import (
	"errors"
	"regexp"
	"testing"
	"time"
)

func TestAppConfigFromEnv(t *testing.T) {
	base := []string{"DATABASE_URL=postgres://u:pw@127.0.0.1:5432/db?sslmode=disable"}
	c, err := AppConfigFromEnv(base)
	if err != nil || c.APITimeout != 10*time.Second || c.WorkerConcurrency != 10 || c.WorkerJobTimeout != time.Minute || c.HTTPAddr != "127.0.0.1:8080" {
		t.Fatalf("defaults: %+v, %v", c.AppSettings, err)
	}
	for env, want := range map[string]string{
		"API_TIMEOUT=fast":                 `API_TIMEOUT is malformed: unable to parse duration: time: invalid duration "fast"`,
		"API_TIMEOUT=0s":                   "API_TIMEOUT must be positive",
		"WORKER_CONCURRENCY=0":             "WORKER_CONCURRENCY must be at least 1",
		"LOG_LEVEL=loud":                   `LOG_LEVEL must be debug, info, warn or error, got "loud"`,
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
