package di

import (
	"errors"
	"fmt"
	"net"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/jackc/pgx/v5"
)

// AppConfig is Config plus the settings only the three apps read.
type AppConfig struct {
	Config
	AppSettings
}

// AppSettings tune the apps' calls to the external API and the worker.
type AppSettings struct {
	APITimeout        time.Duration `env:"API_TIMEOUT" envDefault:"10s"`
	WorkerConcurrency int           `env:"WORKER_CONCURRENCY" envDefault:"10"`
	// WorkerJobTimeout bounds one event.
	WorkerJobTimeout time.Duration `env:"WORKER_JOB_TIMEOUT" envDefault:"1m"`
	LogLevel         string        `env:"LOG_LEVEL" envDefault:"info"`  // debug, info, warn or error
	LogFormat        string        `env:"LOG_FORMAT" envDefault:"json"` // json or text (key=value lines)
	// MetricsAddr serves GET /metrics on a listener of its own.
	MetricsAddr string `env:"METRICS_ADDR"`
	// MetricsConnectionLabel: see tokenguard.WithMetricsPerConnection.
	MetricsConnectionLabel bool `env:"METRICS_CONNECTION_LABEL" envDefault:"false"`
	Network
}

// ConfigError is a missing or malformed setting, named in the message (exit status 2).
type ConfigError struct{ Msg string }

func (e *ConfigError) Error() string { return e.Msg }

func configErr(format string, args ...any) error {
	return &ConfigError{Msg: fmt.Sprintf(format, args...)}
}

// ConfigFromEnvChecked is ConfigFromEnv that also parses the database URLs, with *ConfigError.
func ConfigFromEnvChecked(environ []string) (Config, error) {
	c, err := ConfigFromEnv(environ)
	if err != nil {
		return Config{}, &ConfigError{Msg: err.Error()}
	}
	for _, v := range [][2]string{{"DATABASE_URL", c.DatabaseURL}, {"DATABASE_LISTEN_URL", c.DatabaseListenURL}, {"MIGRATE_DATABASE_URL", c.MigrateDatabaseURL}} {
		if v[1] == "" {
			continue
		}
		if _, err := pgx.ParseConfig(v[1]); err != nil {
			return Config{}, configErr("%s is malformed: %s", v[0], parseCause.ReplaceAllString(err.Error(), ""))
		}
	}
	return c, nil
}

var parseCause = regexp.MustCompile("^cannot parse `.*?`: ")

// AppConfigFromEnv reads an app's configuration from environ.
func AppConfigFromEnv(environ []string) (AppConfig, error) {
	c, err := ConfigFromEnvChecked(environ)
	if err != nil {
		return AppConfig{}, err
	}
	var s AppSettings
	if err := env.ParseWithOptions(&s, env.Options{Environment: env.ToMap(environ)}); err != nil {
		var parse env.ParseError
		if errors.As(err, &parse) {
			return AppConfig{}, configErr("%s is malformed: %v", envKey(reflect.TypeFor[AppSettings](), parse.Name), parse.Err)
		}
		return AppConfig{}, &ConfigError{Msg: err.Error()}
	}
	switch {
	case s.APITimeout <= 0:
		return AppConfig{}, configErr("API_TIMEOUT must be positive")
	case s.WorkerConcurrency < 1:
		return AppConfig{}, configErr("WORKER_CONCURRENCY must be at least 1")
	case s.WorkerJobTimeout <= 0:
		return AppConfig{}, configErr("WORKER_JOB_TIMEOUT must be positive")
	}
	if !slices.Contains([]string{"debug", "info", "warn", "error"}, strings.ToLower(s.LogLevel)) {
		return AppConfig{}, configErr("LOG_LEVEL must be debug, info, warn or error, got %q", s.LogLevel)
	}
	if !slices.Contains([]string{"json", "text"}, strings.ToLower(s.LogFormat)) {
		return AppConfig{}, configErr("LOG_FORMAT must be json or text, got %q", s.LogFormat)
	}
	if s.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(s.MetricsAddr); err != nil {
			return AppConfig{}, configErr("METRICS_ADDR must be host:port, got %q", s.MetricsAddr)
		}
	}
	if err := s.Network.validate(c.AllowInsecureURLs); err != nil {
		return AppConfig{}, err
	}
	return AppConfig{Config: c, AppSettings: s}, nil
}

// requireAPI reports what an app that calls the external API is missing.
func (c AppConfig) requireAPI() error {
	if c.APIBaseURL == "" {
		return configErr("API_BASE_URL is required")
	}
	if err := c.RequireOAuth(); err != nil {
		return &ConfigError{Msg: err.Error()}
	}
	return nil
}
