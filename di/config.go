package di

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/jackc/pgx/v5"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/clientkey"
	"github.com/tokenguard/tokenguard/infra/provider/profiles"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/repository"
)

// Config is everything the apps read from the environment (docs/configuration.md).
type Config struct {
	DatabaseURL    string        `env:"DATABASE_URL,required,notEmpty"`
	OAuth          OAuthConfig   `envPrefix:"OAUTH_"`
	APIBaseURL     string        `env:"API_BASE_URL"`
	HTTPAddr       string        `env:"HTTP_ADDR" envDefault:"127.0.0.1:8080"`
	RefreshSkew    time.Duration `env:"TOKEN_REFRESH_SKEW" envDefault:"30s"`
	LockWait       time.Duration `env:"TOKEN_LOCK_WAIT" envDefault:"15s"`
	RefreshTimeout time.Duration `env:"TOKEN_REFRESH_TIMEOUT" envDefault:"10s"`
	AnswerDeadline time.Duration `env:"TOKEN_ANSWER_DEADLINE" envDefault:"2m"`
	DBMaxConns     int           `env:"DB_MAX_CONNS" envDefault:"10"`
	// CacheSize and MaxRefreshesInFlight bound each process.
	CacheSize            int    `env:"TOKEN_CACHE_SIZE" envDefault:"10000"`
	MaxRefreshesInFlight int    `env:"TOKEN_MAX_REFRESHES_IN_FLIGHT" envDefault:"64"`
	SyncCommit           string `env:"TOKEN_SYNC_COMMIT"`
	MigrateOnStart       bool   `env:"MIGRATE_ON_START" envDefault:"true"`
	// EncryptionKeys seals tokens at rest (format: infra/tokencrypt).
	EncryptionKeys tokencrypt.KeySpec `env:"TOKEN_ENCRYPTION_KEYS"`
	// RequireEncryption refuses plaintext rows; unset, whenever TOKEN_ENCRYPTION_KEYS is set (false only until rotate-key sealed them).
	RequireEncryption *bool         `env:"TOKEN_ENCRYPTION_REQUIRED"`
	DefaultLifetime   time.Duration `env:"TOKEN_DEFAULT_LIFETIME"`
	// EndpointCheck logs a misconfigured client at start, not at the first refresh.
	EndpointCheck bool `env:"TOKEN_ENDPOINT_CHECK" envDefault:"true"`
	// ExpiringNotice announces a refresh token this long before its expiry; 0: never.
	ExpiringNotice time.Duration `env:"TOKEN_EXPIRING_NOTICE" envDefault:"336h"`
	// AllowInsecureURLs accepts http:// URLs off loopback (a test network).
	AllowInsecureURLs bool `env:"ALLOW_INSECURE_URLS" envDefault:"false"`
	// DatabaseListenURL is a direct session for LISTEN when DATABASE_URL goes through a transaction pooler;
	// MigrateDatabaseURL one for the migrations' session lock (default DATABASE_LISTEN_URL).
	DatabaseListenURL  string `env:"DATABASE_LISTEN_URL"`
	MigrateDatabaseURL string `env:"MIGRATE_DATABASE_URL"`
}

// OAuthConfig is the client registration at the provider.
type OAuthConfig struct {
	ClientID      string        `env:"CLIENT_ID"`
	ClientSecret  domain.Secret `env:"CLIENT_SECRET"` // masked under every verb and encoder
	TokenURL      string        `env:"TOKEN_URL"`
	RevocationURL string        `env:"REVOCATION_URL"`
	AuthURL       string        `env:"AUTH_URL"`
	RedirectURL   string        `env:"REDIRECT_URL"`
	Scopes        []string      `env:"SCOPES" envSeparator:","`
	// AuthStyle is auto, header, params or private_key_jwt; unset: the profile's, else auto.
	AuthStyle       string   `env:"AUTH_STYLE"`
	Profile         string   `env:"PROFILE"`
	ProfileParams   []string `env:"PROFILE_PARAMS" envSeparator:","`
	UserInfoURL     string   `env:"USERINFO_URL"`
	UserInfoIDField string   `env:"USERINFO_ID_FIELD" envDefault:"sub"`
	DPoP            bool     `env:"DPOP"`
	// ClientKeyFile is the PEM private key of private_key_jwt.
	ClientKeyFile string `env:"CLIENT_KEY_FILE"`
	Resource      string `env:"RESOURCE"`
	PAR           string `env:"PAR" envDefault:"auto"`
	TokenRate     string `env:"TOKEN_RATE"` // N/PERIOD

	params map[string]string // ProfileParams, parsed
	key    *clientkey.Key    // ClientKeyFile's, parsed
}

// EncryptionRequired reports whether plaintext rows are refused.
func (c Config) EncryptionRequired() bool {
	if c.RequireEncryption != nil {
		return *c.RequireEncryption
	}
	return c.hasKeys()
}

// ListenURL is where the change listener holds its session.
func (c Config) ListenURL() string { return cmp.Or(c.DatabaseListenURL, c.DatabaseURL) }

// MigrateURL is where migrations run.
func (c Config) MigrateURL() string {
	return cmp.Or(c.MigrateDatabaseURL, c.DatabaseListenURL, c.DatabaseURL)
}

// String never shows the client secret or the database password.
func (c Config) String() string {
	return fmt.Sprintf("{database:%s token_url:%s client_id:%s skew:%v lock_wait:%v refresh_timeout:%v encryption:%s}",
		redactURL(c.DatabaseURL), c.OAuth.TokenURL, c.OAuth.ClientID, c.RefreshSkew, c.LockWait, c.RefreshTimeout, c.encryption())
}

// GoString keeps %#v as quiet as %v.
func (c Config) GoString() string { return "di.Config" + c.String() }

// LogValue keeps slog as quiet as %v.
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("database", redactURL(c.DatabaseURL)),
		slog.String("token_url", c.OAuth.TokenURL),
		slog.String("client_id", c.OAuth.ClientID),
		slog.Duration("skew", c.RefreshSkew),
		slog.Duration("lock_wait", c.LockWait),
		slog.Duration("refresh_timeout", c.RefreshTimeout),
		slog.Duration("answer_deadline", c.AnswerDeadline),
		slog.String("encryption", c.encryption()),
	)
}

// readKey reads OAUTH_CLIENT_KEY_FILE into key (nil but for private_key_jwt); errors never quote it.
func (o *OAuthConfig) readKey() error {
	if o.AuthStyle != "private_key_jwt" {
		return nil
	}
	data, err := os.ReadFile(o.ClientKeyFile)
	if err != nil {
		return fmt.Errorf("OAUTH_CLIENT_KEY_FILE: %w", errors.Unwrap(err))
	}
	if o.key, err = clientkey.ParsePEM(data); err != nil {
		return fmt.Errorf("OAUTH_CLIENT_KEY_FILE: %w", err)
	}
	return nil
}

// ConfigFromEnv reads and checks the configuration in environ; errors (*ConfigError) name the variable.
func ConfigFromEnv(environ []string) (Config, error) {
	c, err := parseEnv[Config](environ)
	if err == nil {
		err = c.OAuth.applyProfile()
	}
	if err == nil {
		err = c.validate()
	}
	if err == nil {
		err = c.OAuth.readKey()
	}
	if err != nil {
		return Config{}, &ConfigError{Err: err}
	}
	return c, nil
}

// applyProfile fills what OAUTH_PROFILE gives and the environment does not.
func (o *OAuthConfig) applyProfile() error {
	if o.Profile == "" {
		o.AuthStyle = cmp.Or(o.AuthStyle, "auto")
		if len(o.ProfileParams) > 0 {
			return errors.New("OAUTH_PROFILE_PARAMS needs OAUTH_PROFILE")
		}
		return nil
	}
	p, err := profiles.Get(o.Profile)
	if err != nil {
		return fmt.Errorf("OAUTH_PROFILE: %w", err)
	}
	params, err := profiles.ParseParams(o.ProfileParams)
	if err != nil {
		return fmt.Errorf("OAUTH_PROFILE_PARAMS: %w", err)
	}
	u, err := p.Complete(profiles.URLs{Token: o.TokenURL, Auth: o.AuthURL, Revocation: o.RevocationURL}, params)
	if miss, ok := errors.AsType[*profiles.MissingParamError](err); ok {
		return fmt.Errorf("OAUTH_PROFILE=%s needs OAUTH_PROFILE_PARAMS=%s=… (or OAUTH_TOKEN_URL)", p.Name, miss.Params[0])
	}
	if err != nil {
		return fmt.Errorf("OAUTH_PROFILE_PARAMS: %w", err)
	}
	o.TokenURL, o.AuthURL, o.RevocationURL = u.Token, u.Auth, u.Revocation
	o.AuthStyle = cmp.Or(o.AuthStyle, string(p.AuthStyle))
	o.params = params
	return nil
}

func (c Config) validate() error {
	if _, err := domain.ParsePARMode(c.OAuth.PAR); err != nil {
		return fmt.Errorf("OAUTH_PAR must be auto, always or never, got %q: %w", c.OAuth.PAR, domain.ErrInvalidProvider)
	}
	switch {
	case c.RefreshSkew < 0:
		return errors.New("TOKEN_REFRESH_SKEW must not be negative")
	case c.LockWait <= 0:
		return errors.New("TOKEN_LOCK_WAIT must be positive")
	case c.RefreshTimeout <= 0 || c.RefreshTimeout >= c.LockWait:
		return fmt.Errorf("TOKEN_REFRESH_TIMEOUT must be positive and shorter than TOKEN_LOCK_WAIT (%v)", c.LockWait)
	case c.AnswerDeadline < c.RefreshTimeout:
		return fmt.Errorf("TOKEN_ANSWER_DEADLINE must not be shorter than TOKEN_REFRESH_TIMEOUT (%v)", c.RefreshTimeout)
	case c.DefaultLifetime < 0:
		return errors.New("TOKEN_DEFAULT_LIFETIME must not be negative")
	case c.ExpiringNotice < 0:
		return errors.New("TOKEN_EXPIRING_NOTICE must not be negative (0 announces no expiry)")
	case c.DBMaxConns < 1:
		return errors.New("DB_MAX_CONNS must be at least 1")
	case c.MaxRefreshesInFlight < 1:
		return errors.New("TOKEN_MAX_REFRESHES_IN_FLIGHT must be at least 1")
	case c.CacheSize < 1:
		return errors.New("TOKEN_CACHE_SIZE must be at least 1")
	}
	if _, err := repository.ParseSyncCommit(c.SyncCommit); err != nil {
		return fmt.Errorf("TOKEN_SYNC_COMMIT: %w", err)
	}
	switch style := c.OAuth.AuthStyle; {
	case !slices.Contains([]string{"", "auto", "header", "params", "private_key_jwt"}, style):
		return fmt.Errorf("OAUTH_AUTH_STYLE must be auto, header, params or private_key_jwt, got %q", style)
	case style == "private_key_jwt" && c.OAuth.ClientKeyFile == "":
		return errors.New("OAUTH_AUTH_STYLE=private_key_jwt needs OAUTH_CLIENT_KEY_FILE")
	}
	if _, err := domain.ParseTokenRate(c.OAuth.TokenRate); err != nil {
		return fmt.Errorf("OAUTH_TOKEN_RATE: %w", err)
	}
	if _, err := c.keyring(); err != nil {
		return err
	}
	if c.EncryptionRequired() && !c.hasKeys() {
		return errors.New("TOKEN_ENCRYPTION_REQUIRED needs TOKEN_ENCRYPTION_KEYS")
	}
	if c.OAuth.RedirectURL != "" && domain.CheckURL(c.OAuth.RedirectURL, true) != nil {
		return fmt.Errorf("OAUTH_REDIRECT_URL must be an http(s) URL, got %q", c.OAuth.RedirectURL)
	}
	// Tokens, codes and the client secret travel to these.
	for _, s := range [][2]string{{"OAUTH_TOKEN_URL", c.OAuth.TokenURL}, {"OAUTH_AUTH_URL", c.OAuth.AuthURL},
		{"API_BASE_URL", c.APIBaseURL}, {"OAUTH_USERINFO_URL", c.OAuth.UserInfoURL}, {"OAUTH_REVOCATION_URL", c.OAuth.RevocationURL}} {
		if err := checkURL(s[0], s[1], c.AllowInsecureURLs); err != nil {
			return err
		}
	}
	for _, v := range [][2]string{{"DATABASE_URL", c.DatabaseURL}, {"DATABASE_LISTEN_URL", c.DatabaseListenURL}, {"MIGRATE_DATABASE_URL", c.MigrateDatabaseURL}} {
		if v[1] == "" {
			continue
		}
		if _, err := pgx.ParseConfig(v[1]); err != nil {
			return fmt.Errorf("%s is malformed: %s", v[0], parseCause.ReplaceAllString(err.Error(), ""))
		}
	}
	return nil
}

var parseCause = regexp.MustCompile("^cannot parse `.*?`: ")

// checkURL is domain.CheckURL with an error that names the setting.
func checkURL(name, v string, allowInsecure bool) error {
	if err := domain.CheckURL(v, allowInsecure); v != "" && err != nil {
		return fmt.Errorf("%s %v, got %q", name, err, redactURL(v))
	}
	return nil
}

// RequireOAuth reports the first setting a refreshing app is missing.
func (c Config) RequireOAuth() error {
	switch {
	case c.OAuth.TokenURL == "":
		return configErr("OAUTH_TOKEN_URL is required")
	case c.OAuth.ClientID == "":
		return configErr("OAUTH_CLIENT_ID is required")
	}
	return nil
}

// parseEnv reads T's env tags from environ; errors name the variable, not the Go field.
func parseEnv[T any](environ []string) (T, error) {
	var v T
	err := env.ParseWithOptions(&v, env.Options{Environment: env.ToMap(environ), FuncMap: map[reflect.Type]env.ParserFunc{
		reflect.TypeFor[domain.Secret](): func(s string) (any, error) { return domain.NewSecret(s), nil }}})
	agg, ok := errors.AsType[env.AggregateError](err)
	if !ok || len(agg.Errors) == 0 {
		return v, err
	}
	var msgs []string
	for _, e := range agg.Errors {
		msg := e.Error()
		if notSet, ok := errors.AsType[env.VarIsNotSetError](e); ok {
			msg = notSet.Key + " is required"
		} else if empty, ok := errors.AsType[env.EmptyVarError](e); ok {
			msg = empty.Key + " must not be empty"
		} else if parse, ok := errors.AsType[env.ParseError](e); ok { // it names the Go field
			vars, name := envVars(reflect.TypeFor[T](), ""), parse.Name
			if i := slices.IndexFunc(vars, func(v envVar) bool { return v.field == parse.Name }); i >= 0 {
				name = vars[i].name
			}
			msg = fmt.Sprintf("%s is malformed: %v", name, parse.Err)
		}
		msgs = append(msgs, msg)
	}
	return v, errors.New(strings.Join(msgs, "; "))
}

var (
	dsnPassword    = regexp.MustCompile(`(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`) // host=db password='p w'
	urlCredentials = regexp.MustCompile(`://[^/]*@`)                                      // of a URL url.Parse refused
)

// redactURL masks the password of a database URL or key=value string.
func redactURL(s string) string {
	if !strings.Contains(s, "://") {
		return dsnPassword.ReplaceAllString(s, "${1}xxxxx")
	}
	u, err := url.Parse(s)
	if err != nil {
		return urlCredentials.ReplaceAllString(s, "://xxxxx@")
	}
	return u.Redacted()
}

// hasKeys reports whether TOKEN_ENCRYPTION_KEYS is set, not blank.
func (c Config) hasKeys() bool { return strings.TrimSpace(string(c.EncryptionKeys)) != "" }

// keyring parses TOKEN_ENCRYPTION_KEYS; nil without keys.
func (c Config) keyring() (*tokencrypt.Keyring, error) {
	if !c.hasKeys() {
		return nil, nil
	}
	return c.EncryptionKeys.Keyring()
}

// encryption is what String shows: key ids, never keys.
func (c Config) encryption() string {
	switch k, err := c.keyring(); {
	case err != nil:
		return "invalid"
	case k == nil:
		return "off"
	default:
		return "current=" + k.Current()
	}
}

// sealer seals token values with the keyring, when one is configured.
func (c Config) sealer() (repository.Sealer, error) {
	k, err := c.keyring()
	if err != nil || k == nil {
		return tokencrypt.Plaintext{}, err
	}
	return k, nil
}
