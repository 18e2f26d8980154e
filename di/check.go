package di

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/infra/tokenctl"
)

// checkTimeout bounds tokenctl check's requests.
const checkTimeout = 10 * time.Second

// Check is tokenctl check. It reads only the OAUTH_ settings, so it can
// run before the database exists.
func (b tokenctlBackend) Check(ctx context.Context) (provider.CheckResult, error) {
	o, err := oauthFromEnv(b.environ)
	if err != nil {
		return provider.CheckResult{}, &tokenctl.ConfigError{Err: err}
	}
	client := provider.NewHTTPClient(checkTimeout)
	client.Transport = userAgent{base: client.Transport, value: UserAgent("tokenctl")}
	return provider.Check(ctx, checkConfig(o), client), nil
}

// oauthFromEnv reads and checks the settings tokenctl check needs.
func oauthFromEnv(environ []string) (OAuthConfig, error) {
	var o OAuthConfig
	if err := env.ParseWithOptions(&o, env.Options{Environment: env.ToMap(environ), Prefix: "OAUTH_"}); err != nil {
		return OAuthConfig{}, friendly(err)
	}
	if o.TokenURL == "" {
		return OAuthConfig{}, errors.New("OAUTH_TOKEN_URL is required")
	}
	if u, err := url.Parse(o.TokenURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return OAuthConfig{}, fmt.Errorf("OAUTH_TOKEN_URL must be an http(s) URL, got %q", o.TokenURL)
	}
	if o.ClientID == "" {
		return OAuthConfig{}, errors.New("OAUTH_CLIENT_ID is required")
	}
	if !strings.EqualFold(o.AuthStyle, "auto") {
		if _, err := o.authStyle(); err != nil {
			return OAuthConfig{}, err
		}
	}
	return o, nil
}

// checkConfig is the client registration the check probes: with
// OAUTH_AUTH_STYLE=auto it tries both styles and says which one works.
func checkConfig(o OAuthConfig) *oauth2.Config {
	oc := OAuth2Config(o)
	if strings.EqualFold(o.AuthStyle, "auto") {
		oc.Endpoint.AuthStyle = oauth2.AuthStyleAutoDetect
	}
	return oc
}

// checkAtStart runs the token endpoint check in the background, so that
// start-up does not wait on the provider, and logs its verdict in one
// line. stop cancels it and waits for it.
func checkAtStart(ctx context.Context, cfg Config, app string, log *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		client := provider.NewHTTPClient(cfg.RefreshTimeout)
		client.Transport = userAgent{base: client.Transport, value: UserAgent(app)}
		res := provider.Check(ctx, checkConfig(cfg.OAuth), client)
		if ctx.Err() != nil {
			return // stopped before the endpoint answered: nothing to tell
		}
		level := slog.LevelError
		switch res.Verdict {
		case provider.CheckOK:
			level = slog.LevelInfo
		case provider.CheckInconclusive:
			level = slog.LevelWarn
		}
		log.Log(context.Background(), level, "token endpoint check: "+res.String(),
			"verdict", res.Verdict.String(), "auth_style", res.Style())
	}()
	return func() { cancel(); <-done }
}
