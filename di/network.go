package di

import (
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"golang.org/x/time/rate"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/httpapi"
	"github.com/tokenguard/tokenguard/infra/queue"
)

// Network is what the server needs to face a network, and the worker's webhook.
type Network struct {
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
	WebhookURL    string       `env:"WEBHOOK_URL"`
	WebhookSecret SecretString `env:"WEBHOOK_SECRET"`
}

// SecretString is a secret setting: [REDACTED] under every verb and encoder.
type SecretString string

func (s SecretString) mask() string {
	if s == "" {
		return ""
	}
	return "[REDACTED]"
}

func (s SecretString) String() string               { return s.mask() }
func (s SecretString) GoString() string             { return s.mask() }
func (s SecretString) Format(f fmt.State, _ rune)   { _, _ = f.Write([]byte(s.mask())) }
func (s SecretString) LogValue() slog.Value         { return slog.StringValue(s.mask()) }
func (s SecretString) MarshalText() ([]byte, error) { return []byte(s.mask()), nil }

func (n Network) validate(allowInsecure bool) error {
	if n.PublicURL != "" {
		u, err := url.Parse(n.PublicURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return configErr("PUBLIC_URL must be an http(s) origin such as https://tokenguard.example.com, got %q", n.PublicURL)
		}
		if err := checkURL("PUBLIC_URL", n.PublicURL, allowInsecure); err != nil {
			return &ConfigError{Msg: err.Error()}
		}
	}
	for _, r := range n.ConnectReturnURLs {
		if u, err := url.Parse(r); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return configErr("CONNECT_RETURN_URLS must be comma-separated http(s) URLs, got %q", r)
		}
	}
	switch {
	case n.APIKeyRate <= 0:
		return configErr("API_KEY_RATE must be positive (requests per second per API key)")
	case n.APIKeyBurst < 1:
		return configErr("API_KEY_BURST must be at least 1")
	case n.RequestTimeout <= 0:
		return configErr("HTTP_REQUEST_TIMEOUT must be positive")
	case n.ProxyMaxBody < 1:
		return configErr("PROXY_MAX_BODY must be at least 1 (bytes)")
	case (n.WebhookURL == "") != (n.WebhookSecret == ""):
		return configErr("WEBHOOK_URL and WEBHOOK_SECRET are set together")
	case n.WebhookSecret != "" && len(n.WebhookSecret) < 16:
		return configErr("WEBHOOK_SECRET must be at least 16 characters (e.g. openssl rand -hex 32)")
	}
	if n.WebhookURL != "" {
		if err := domain.CheckURL(n.WebhookURL, allowInsecure); err != nil {
			return configErr("WEBHOOK_URL %v", err) // not the URL: it may carry a token
		}
	}
	return nil
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
	return &queue.Webhook{URL: c.WebhookURL, Secret: domain.NewSecret(string(c.WebhookSecret)), UserAgent: UserAgent(app)}
}
