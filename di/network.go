package di

import (
	"fmt"
	"log/slog"
	"net/url"
	"strings"

	"golang.org/x/time/rate"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/httpapi"
	"github.com/tokenguard/tokenguard/infra/queue"
)

// SecretString is a secret setting: [REDACTED] under every verb and encoder.
type SecretString string

func (s SecretString) String() string {
	if s == "" {
		return ""
	}
	return "[REDACTED]"
}

func (s SecretString) Format(f fmt.State, _ rune)   { _, _ = f.Write([]byte(s.String())) }
func (s SecretString) LogValue() slog.Value         { return slog.StringValue(s.String()) }
func (s SecretString) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

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
