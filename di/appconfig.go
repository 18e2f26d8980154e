package di

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	"golang.org/x/time/rate"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/httpapi"
	"github.com/tokenguard/tokenguard/infra/queue"
	"github.com/tokenguard/tokenguard/infra/tokenctl"
)

// AppConfig is Config plus the settings only the three apps read.
type AppConfig struct {
	Config
	AppSettings
}

// AppSettings tune the apps' calls to the external API, the worker, the server's public listener and the worker's webhook.
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
	// PublicURL is the server's address as browsers use it.
	PublicURL string `env:"PUBLIC_URL"`
	// ConnectReturnURLs are the prefixes a return_to may start with.
	ConnectReturnURLs []string `env:"CONNECT_RETURN_URLS" envSeparator:","`
	// APIKeyRate and APIKeyBurst limit each API key's requests per second.
	APIKeyRate     float64       `env:"API_KEY_RATE" envDefault:"100"`
	APIKeyBurst    int           `env:"API_KEY_BURST" envDefault:"200"`
	RequestTimeout time.Duration `env:"HTTP_REQUEST_TIMEOUT" envDefault:"30s"`
	ProxyMaxBody   int64         `env:"PROXY_MAX_BODY" envDefault:"10485760"` // bytes
	// WebhookURL and WebhookSecret: the worker POSTs signed events there.
	WebhookURL    string        `env:"WEBHOOK_URL"`
	WebhookSecret domain.Secret `env:"WEBHOOK_SECRET"`
}

// ConfigError is a missing or malformed setting, named in the message: tokenctl's, exit status 2 for both.
type ConfigError = tokenctl.ConfigError

func configErr(format string, args ...any) error {
	return &ConfigError{Err: fmt.Errorf(format, args...)}
}

// AppConfigFromEnv reads an app's configuration from environ.
func AppConfigFromEnv(environ []string) (AppConfig, error) {
	c, err := ConfigFromEnv(environ)
	if err != nil {
		return AppConfig{}, err
	}
	s, err := parseEnv[AppSettings](environ)
	if err == nil {
		err = s.validate(c.AllowInsecureURLs)
	}
	if err != nil {
		return AppConfig{}, &ConfigError{Err: err}
	}
	return AppConfig{Config: c, AppSettings: s}, nil
}

func (s AppSettings) validate(allowInsecure bool) error {
	_, _, addrErr := net.SplitHostPort(s.MetricsAddr)
	switch {
	case s.APITimeout <= 0:
		return errors.New("API_TIMEOUT must be positive")
	case s.WorkerConcurrency < 1:
		return errors.New("WORKER_CONCURRENCY must be at least 1")
	case s.WorkerJobTimeout <= 0:
		return errors.New("WORKER_JOB_TIMEOUT must be positive")
	case !slices.Contains([]string{"debug", "info", "warn", "error"}, strings.ToLower(s.LogLevel)):
		return fmt.Errorf("LOG_LEVEL must be debug, info, warn or error, got %q", s.LogLevel)
	case !slices.Contains([]string{"json", "text"}, strings.ToLower(s.LogFormat)):
		return fmt.Errorf("LOG_FORMAT must be json or text, got %q", s.LogFormat)
	case s.MetricsAddr != "" && addrErr != nil:
		return fmt.Errorf("METRICS_ADDR must be host:port, got %q", s.MetricsAddr)
	case s.APIKeyRate <= 0:
		return errors.New("API_KEY_RATE must be positive (requests per second per API key)")
	case s.APIKeyBurst < 1:
		return errors.New("API_KEY_BURST must be at least 1")
	case s.RequestTimeout <= 0:
		return errors.New("HTTP_REQUEST_TIMEOUT must be positive")
	case s.ProxyMaxBody < 1:
		return errors.New("PROXY_MAX_BODY must be at least 1 (bytes)")
	case (s.WebhookURL == "") != s.WebhookSecret.IsZero():
		return errors.New("WEBHOOK_URL and WEBHOOK_SECRET are set together")
	case !s.WebhookSecret.IsZero() && len(s.WebhookSecret.Reveal()) < 16:
		return errors.New("WEBHOOK_SECRET must be at least 16 characters (e.g. openssl rand -hex 32)")
	}
	if u, _ := url.Parse(s.PublicURL); s.PublicURL != "" && (domain.CheckURL(s.PublicURL, true) != nil || (u.Path != "" && u.Path != "/")) {
		return fmt.Errorf("PUBLIC_URL must be an http(s) origin such as https://tokenguard.example.com, got %q", s.PublicURL)
	}
	if err := checkURL("PUBLIC_URL", s.PublicURL, allowInsecure); err != nil {
		return err
	}
	for _, r := range s.ConnectReturnURLs {
		if domain.CheckURL(r, true) != nil {
			return fmt.Errorf("CONNECT_RETURN_URLS must be comma-separated http(s) URLs, got %q", r)
		}
	}
	if err := domain.CheckURL(s.WebhookURL, allowInsecure); s.WebhookURL != "" && err != nil {
		return fmt.Errorf("WEBHOOK_URL %v", err) // not the URL: it may carry a token
	}
	return nil
}

// requireAPI reports what an app that calls the external API is missing.
func (c AppConfig) requireAPI() error {
	if c.APIBaseURL == "" {
		return configErr("API_BASE_URL is required")
	}
	return c.RequireOAuth()
}

// edges are the public listener's limits from the configuration.
func (c AppConfig) edges() httpapi.Edges {
	e := httpapi.Edges{
		ReturnURLs:     c.ConnectReturnURLs,
		Rate:           rate.Limit(c.APIKeyRate),
		Burst:          c.APIKeyBurst,
		RequestTimeout: c.RequestTimeout,
		ProxyMaxBody:   c.ProxyMaxBody,
		Hosts:          []string{c.HTTPAddr},
	}
	if c.PublicURL != "" {
		e.PublicURL, _ = url.Parse(strings.TrimSuffix(c.PublicURL, "/")) // checked by validate
	}
	if u, err := url.Parse(c.OAuth.RedirectURL); err == nil && u.Host != "" {
		e.Hosts = append(e.Hosts, u.Host) // the callback arrives there
	}
	return e
}

// webhook is the worker's webhook, nil without WEBHOOK_URL.
func (c AppConfig) webhook(app string) *queue.Webhook {
	if c.WebhookURL == "" {
		return nil
	}
	return &queue.Webhook{URL: c.WebhookURL, Secret: c.WebhookSecret, UserAgent: UserAgent(app)}
}
