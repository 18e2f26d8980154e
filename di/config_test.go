package di

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

func TestConfigFromEnvDefaults(t *testing.T) {
	c, err := ConfigFromEnv([]string{
		"DATABASE_URL=postgres://u:pw@db/x", "OAUTH_TOKEN_URL=https://p/token", "OAUTH_CLIENT_ID=id",
		"OAUTH_SCOPES=read,write",
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.HTTPAddr != "127.0.0.1:8080" || c.RefreshSkew != 30*time.Second || !c.MigrateOnStart ||
		c.OAuth.AuthStyle != "auto" || c.DefaultLifetime != 0 || !c.EndpointCheck ||
		len(c.OAuth.Scopes) != 2 || c.OAuth.Scopes[1] != "write" {
		t.Errorf("config = %+v", c)
	}
	if err := c.RequireOAuth(); err != nil {
		t.Error(err)
	}
	c.OAuth.ClientSecret = domain.NewSecret("client-SECRET")
	for _, s := range []string{c.String(), fmt.Sprintf("%v|%+v|%#v|%v|%#v", c, c, c, c.OAuth, c.OAuth)} {
		if strings.Contains(s, "pw") || strings.Contains(s, "SECRET") {
			t.Errorf("configuration printing leaks a secret: %s", s)
		}
	}
}

func TestConfigErrorsNameTheVariable(t *testing.T) {
	base := []string{"DATABASE_URL=postgres://db/x"}
	cases := map[string]struct {
		env  []string
		want string
	}{
		"missing database":  {nil, "DATABASE_URL is required"},
		"empty database":    {[]string{"DATABASE_URL="}, "DATABASE_URL"},
		"malformed skew":    {append(base, "TOKEN_REFRESH_SKEW=soon"), "TOKEN_REFRESH_SKEW is malformed"},
		"malformed conns":   {append(base, "DB_MAX_CONNS=many"), "DB_MAX_CONNS is malformed"},
		"negative skew":     {append(base, "TOKEN_REFRESH_SKEW=-1s"), "TOKEN_REFRESH_SKEW"},
		"timeout vs wait":   {append(base, "TOKEN_LOCK_WAIT=2s", "TOKEN_REFRESH_TIMEOUT=3s"), "TOKEN_REFRESH_TIMEOUT"},
		"token url":         {append(base, "OAUTH_TOKEN_URL=not a url"), "OAUTH_TOKEN_URL"},
		"api base url":      {append(base, "API_BASE_URL=ftp://x"), "API_BASE_URL"},
		"bool":              {append(base, "MIGRATE_ON_START=perhaps"), "MIGRATE_ON_START is malformed"},
		"oauth scopes okay": {append(base, "OAUTH_SCOPES="), ""},
		"auth style":        {append(base, "OAUTH_AUTH_STYLE=basic"), "OAUTH_AUTH_STYLE must be auto, header, params or private_key_jwt"},
		"pkjwt no key":      {append(base, "OAUTH_AUTH_STYLE=private_key_jwt"), "needs OAUTH_CLIENT_KEY_FILE"},
		"pkjwt bad key":     {append(base, "OAUTH_AUTH_STYLE=private_key_jwt", "OAUTH_CLIENT_KEY_FILE=/nonexistent/key.pem"), "OAUTH_CLIENT_KEY_FILE"},
		"auth style auto":   {append(base, "OAUTH_AUTH_STYLE=auto"), ""},
		"par bad":           {append(base, "OAUTH_PAR=sometimes"), "OAUTH_PAR must be auto, always or never"},
		"par always":        {append(base, "OAUTH_PAR=always"), ""},
		"par never":         {append(base, "OAUTH_PAR=never"), ""},
		"auth style header": {append(base, "OAUTH_AUTH_STYLE=header"), ""},
		"auth style params": {append(base, "OAUTH_AUTH_STYLE=params"), ""},
		"default lifetime":  {append(base, "TOKEN_DEFAULT_LIFETIME=1h"), ""},
		"bad lifetime":      {append(base, "TOKEN_DEFAULT_LIFETIME=long"), "TOKEN_DEFAULT_LIFETIME is malformed"},
		"negative lifetime": {append(base, "TOKEN_DEFAULT_LIFETIME=-1s"), "TOKEN_DEFAULT_LIFETIME must not be negative"},
		"sync commit":       {append(base, "TOKEN_SYNC_COMMIT=remote_apply"), ""},
		"bad sync commit":   {append(base, "TOKEN_SYNC_COMMIT=always"), "TOKEN_SYNC_COMMIT: invalid synchronous_commit level"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := ConfigFromEnv(c.env)
			if c.want == "" {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to mention %q", err, c.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error spans several lines: %q", err)
			}
		})
	}
	c, _ := ConfigFromEnv(base)
	if err := c.RequireOAuth(); err == nil || !strings.Contains(err.Error(), "OAUTH_TOKEN_URL") {
		t.Errorf("RequireOAuth = %v", err)
	}
}

func TestConfigNeverPrintsSecrets(t *testing.T) {
	for _, dsn := range []string{
		"postgres://u:hunter2@db:5432/x",
		"host=db user=u password=hunter2 dbname=x",
		"host=db password='hunter2 with spaces' dbname=x",
		"host=db PASSWORD = hunter2",
		"postgres://u:hun%zzter2@db/x", // url.Parse refuses it, and so does ConfigFromEnv
	} {
		c, err := ConfigFromEnv([]string{"DATABASE_URL=" + dsn, "OAUTH_CLIENT_SECRET=s3cr3t-client",
			"TOKEN_ENCRYPTION_KEYS=k1=" + base64.StdEncoding.EncodeToString(make([]byte, 32)) + "*"})
		if strings.Contains(dsn, "%zz") {
			if err == nil || strings.Contains(err.Error(), "zzter2") {
				t.Errorf("%s: err = %v, want one that does not quote the password", dsn, err)
			}
			c, err = ConfigFromEnv([]string{"DATABASE_URL=postgres://db/x", "OAUTH_CLIENT_SECRET=s3cr3t-client",
				"TOKEN_ENCRYPTION_KEYS=k1=" + base64.StdEncoding.EncodeToString(make([]byte, 32)) + "*"})
			c.DatabaseURL = dsn
		}
		if err != nil {
			t.Fatalf("%s: %v", dsn, err)
		}
		var buf bytes.Buffer
		slog.New(slog.NewJSONHandler(&buf, nil)).Info("config", "cfg", c, "oauth", c.OAuth)
		for _, out := range []string{fmt.Sprint(c), fmt.Sprintf("%+v", c), fmt.Sprintf("%#v", c), buf.String()} {
			if strings.Contains(out, "hunter2") || strings.Contains(out, "hun%zzter2") || strings.Contains(out, "s3cr3t-client") || strings.Contains(out, "AAAAAAAA") {
				t.Errorf("secret printed: %s", out)
			}
		}
	}
}

func TestTokenAndAPIURLsMustBeHTTPSOffLoopback(t *testing.T) {
	base := []string{"DATABASE_URL=postgres://x@db/x"}
	for _, tc := range []struct {
		env []string
		ok  bool
	}{
		{[]string{"OAUTH_TOKEN_URL=https://idp.example/token", "API_BASE_URL=https://api.example"}, true},
		{[]string{"OAUTH_TOKEN_URL=http://127.0.0.1:9090/token", "API_BASE_URL=http://localhost:9090"}, true},
		{[]string{"OAUTH_TOKEN_URL=http://[::1]:9090/token"}, true},
		{[]string{"OAUTH_TOKEN_URL=http://idp.example/token"}, false},
		{[]string{"API_BASE_URL=http://api.example"}, false},
		{[]string{"OAUTH_REVOCATION_URL=http://idp.example/revoke"}, false},
		{[]string{"OAUTH_REVOCATION_URL=http://127.0.0.1:9090/revoke"}, true},
		{[]string{"OAUTH_TOKEN_URL=http://idp.test/token", "ALLOW_INSECURE_URLS=true"}, true},
		{[]string{"OAUTH_USERINFO_URL=http://idp.example/userinfo"}, false},
		{[]string{"OAUTH_AUTH_URL=http://idp.example/auth"}, false},
		{[]string{"PUBLIC_URL=http://tokenguard.example"}, false},
		{[]string{"PUBLIC_URL=http://127.0.0.1:8080"}, true},
		{[]string{"PUBLIC_URL=http://tokenguard.example", "ALLOW_INSECURE_URLS=true"}, true},
		{[]string{"WEBHOOK_URL=http://hooks.example/tg", "WEBHOOK_SECRET=0123456789abcdef"}, false},
		{[]string{"WEBHOOK_URL=http://localhost:9000/tg", "WEBHOOK_SECRET=0123456789abcdef"}, true},
	} {
		_, err := AppConfigFromEnv(append(base, tc.env...))
		if (err == nil) != tc.ok {
			t.Errorf("%v: err = %v, want ok=%v", tc.env, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "https") {
			t.Errorf("%v: error does not say https: %v", tc.env, err)
		}
	}
}

func TestPoolerURLs(t *testing.T) {
	base := []string{"DATABASE_URL=postgres://pooler:6432/db", "OAUTH_TOKEN_URL=http://127.0.0.1/token", "OAUTH_CLIENT_ID=c"}
	for _, c := range []struct {
		name            string
		env             []string
		listen, migrate string
		pooled          bool
	}{
		{"direct", nil, "postgres://pooler:6432/db", "postgres://pooler:6432/db", false},
		{"listen URL", []string{"DATABASE_LISTEN_URL=postgres://db:5432/db"}, "postgres://db:5432/db", "postgres://db:5432/db", true},
		{"both", []string{"DATABASE_LISTEN_URL=postgres://db:5432/db", "MIGRATE_DATABASE_URL=postgres://admin@db:5432/db"},
			"postgres://db:5432/db", "postgres://admin@db:5432/db", true},
	} {
		cfg, err := ConfigFromEnv(append(append([]string{}, base...), c.env...))
		if err != nil {
			t.Fatal(err)
		}
		if cfg.ListenURL() != c.listen || cfg.MigrateURL() != c.migrate || (cfg.ListenURL() != cfg.DatabaseURL) != c.pooled {
			t.Errorf("%s: listen %q, migrate %q, pooled %v", c.name, cfg.ListenURL(), cfg.MigrateURL(), cfg.ListenURL() != cfg.DatabaseURL)
		}
	}
	if _, err := ConfigFromEnv(append(base, "DATABASE_LISTEN_URL=postgres://x:y@host:notaport/db")); err == nil ||
		!strings.HasPrefix(err.Error(), "DATABASE_LISTEN_URL is malformed") {
		t.Errorf("malformed listen URL: %v", err)
	}
}

// OAUTH_PROFILE gives the URLs and auth style the environment leaves
// unset, its placeholders filled by OAUTH_PROFILE_PARAMS; what is set wins.
func TestConfigProfile(t *testing.T) {
	base := []string{"DATABASE_URL=postgres://x/y", "OAUTH_CLIENT_ID=c"}
	c, err := ConfigFromEnv(append(base, "OAUTH_PROFILE=okta", "OAUTH_PROFILE_PARAMS=domain=acme.okta.com,server=aus1"))
	if err != nil || c.OAuth.TokenURL != "https://acme.okta.com/oauth2/aus1/v1/token" || c.OAuth.RevocationURL != "https://acme.okta.com/oauth2/aus1/v1/revoke" || c.OAuth.AuthStyle != "auto" {
		t.Fatalf("okta: %+v, %v", c.OAuth, err)
	}
	c, err = ConfigFromEnv(append(base, "OAUTH_PROFILE=xero", "OAUTH_TOKEN_URL=http://127.0.0.1:9/token"))
	if err != nil || c.OAuth.TokenURL != "http://127.0.0.1:9/token" || c.OAuth.AuthURL != "https://login.xero.com/identity/connect/authorize" || c.OAuth.AuthStyle != "header" {
		t.Fatalf("xero with the token URL overridden: %+v, %v", c.OAuth, err)
	}
	for env, want := range map[string]string{
		"OAUTH_PROFILE=okta":                          "OAUTH_PROFILE_PARAMS=domain=",
		"OAUTH_PROFILE=nope":                          "unknown provider profile",
		"OAUTH_PROFILE_PARAMS=a=b":                    "needs OAUTH_PROFILE",
		"OAUTH_PROFILE=xero\x00OAUTH_AUTH_STYLE=open": "OAUTH_AUTH_STYLE",
	} {
		_, err := ConfigFromEnv(append(append([]string{}, base...), strings.Split(env, "\x00")...))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error naming %s", env, err, want)
		}
	}
}

func TestEndpointCheckSetting(t *testing.T) {
	base := []string{"DATABASE_URL=postgres://x/y"}
	c, err := ConfigFromEnv(append(base, "TOKEN_ENDPOINT_CHECK=false"))
	if err != nil || c.EndpointCheck {
		t.Fatalf("TOKEN_ENDPOINT_CHECK=false: %v, %v", c.EndpointCheck, err)
	}
	if _, err := ConfigFromEnv(append(base, "TOKEN_ENDPOINT_CHECK=sometimes")); err == nil || !strings.Contains(err.Error(), "TOKEN_ENDPOINT_CHECK") {
		t.Fatalf("a malformed value: %v", err)
	}
}

// TestEncryptionRequiredDefault: with keys, plaintext rows are refused
// unless TOKEN_ENCRYPTION_REQUIRED=false says otherwise; without keys,
// nothing is required (and requiring is an error).
func TestEncryptionRequiredDefault(t *testing.T) {
	key := "TOKEN_ENCRYPTION_KEYS=k1=" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 32))
	for _, tc := range []struct {
		env  []string
		want bool
		ok   bool
	}{
		{nil, false, true},
		{[]string{key}, true, true},
		{[]string{key, "TOKEN_ENCRYPTION_REQUIRED=false"}, false, true},
		{[]string{key, "TOKEN_ENCRYPTION_REQUIRED=true"}, true, true},
		{[]string{"TOKEN_ENCRYPTION_REQUIRED=true"}, false, false},
		{[]string{"TOKEN_ENCRYPTION_REQUIRED=false"}, false, true},
	} {
		c, err := ConfigFromEnv(append([]string{"DATABASE_URL=postgres://x@db/x"}, tc.env...))
		if (err == nil) != tc.ok || (err == nil && c.EncryptionRequired() != tc.want) {
			t.Errorf("%v: required %t, err %v; want %t, ok %t", tc.env, err == nil && c.EncryptionRequired(), err, tc.want, tc.ok)
		}
	}
}
