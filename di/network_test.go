package di

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestNetworkSettings(t *testing.T) {
	base := []string{"DATABASE_URL=postgres://u:pw@127.0.0.1:5432/db?sslmode=disable"}
	c, err := AppConfigFromEnv(append(base, "PUBLIC_URL=https://tg.example.com", "WEBHOOK_URL=https://hooks.example.com/tg",
		"WEBHOOK_SECRET=whsec-0123456789abcdef", "CONNECT_RETURN_URLS=https://app.example.com/a/,https://app.example.com/b"))
	if err != nil || c.APIKeyRate != 100 || c.APIKeyBurst != 200 || len(c.ConnectReturnURLs) != 2 || c.webhook("worker") == nil {
		t.Fatalf("%+v, %v", c.AppSettings, err)
	}
	e := c.edges()
	if e.PublicURL.Host != "tg.example.com" || e.Hosts[0] != "127.0.0.1:8080" {
		t.Errorf("edges: %+v", e)
	}
	js, _ := json.Marshal(c)
	for _, s := range []string{fmt.Sprintf("%v %+v %#v %s %q %x", c, c, c, c.WebhookSecret, c.WebhookSecret, c.WebhookSecret), string(js)} {
		if strings.Contains(s, "whsec") || strings.Contains(s, hexOf("whsec")) {
			t.Errorf("the webhook secret is printed: %s", s)
		}
	}
	for env, want := range map[string]string{
		"PUBLIC_URL=tg.example.com":           `PUBLIC_URL must be an http(s) origin such as https://tokenguard.example.com, got "tg.example.com"`,
		"PUBLIC_URL=https://tg.example.com/x": `PUBLIC_URL must be an http(s) origin such as https://tokenguard.example.com, got "https://tg.example.com/x"`,
		"WEBHOOK_URL=https://h.example":       "WEBHOOK_URL and WEBHOOK_SECRET are set together",
		"WEBHOOK_SECRET=whsec-0123456789abc":  "WEBHOOK_URL and WEBHOOK_SECRET are set together",
		"API_KEY_RATE=0":                      "API_KEY_RATE must be positive (requests per second per API key)",
		"CONNECT_RETURN_URLS=/settings":       `CONNECT_RETURN_URLS must be comma-separated http(s) URLs, got "/settings"`,
	} {
		_, err := AppConfigFromEnv(append(base, env))
		var ce *ConfigError
		if !errors.As(err, &ce) || err.Error() != want {
			t.Errorf("%s: err = %v, want %q", env, err, want)
		}
	}
	if _, err := AppConfigFromEnv(append(base, "WEBHOOK_URL=https://h.example", "WEBHOOK_SECRET=short")); err == nil ||
		!strings.Contains(err.Error(), "at least 16") {
		t.Errorf("short secret: %v", err)
	}
}

func hexOf(s string) string { return fmt.Sprintf("%x", s) }
