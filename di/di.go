// Package di wires tokenguard from configuration with plain constructors:
// no globals, no reflection-driven container. The three apps and the tools
// in cmd/ build everything through it and stay a few lines long.
package di

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"golang.org/x/oauth2"
	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/infra/metrics"
	"github.com/tokenguard/tokenguard/infra/postgres"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/migrations"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// Tokens is the token layer an app shares with the others.
type Tokens struct {
	DB           *gorm.DB
	Repository   *repository.TokenRepository
	RefreshToken *usecase.RefreshTokenUseCase
	Connect      *usecase.ConnectUseCase
	OAuth        *oauth2.Config
}

// NewTokens opens the database (migrating it if cfg says so) and builds the
// use case. Call the returned cleanup when done.
func NewTokens(ctx context.Context, cfg Config, log *slog.Logger) (*Tokens, func(), error) {
	return NewTokensWith(ctx, cfg, log, TokenOptions{})
}

// TokenOptions say which app the token layer serves and where its events
// go. The zero value is an anonymous process without metrics.
type TokenOptions struct {
	// App ("server", "worker", "batch") is announced to the provider's
	// token endpoint as the User-Agent tokenguard-<app>/<version>.
	App string
	// Metrics, when set, observes the use case and the change listener.
	Metrics *metrics.Metrics
}

// NewTokensWith is NewTokens for an app: log (which should carry the
// process identity) receives the one line per refresh, o.Metrics counts.
func NewTokensWith(ctx context.Context, cfg Config, log *slog.Logger, o TokenOptions) (*Tokens, func(), error) {
	if log == nil {
		log = slog.Default()
	}
	if err := cfg.RequireOAuth(); err != nil {
		return nil, nil, err
	}
	if cfg.MigrateOnStart {
		if err := migrations.Up(cfg.DatabaseURL); err != nil {
			return nil, nil, err
		}
	}
	db, err := postgres.Open(ctx, cfg.DatabaseURL, postgres.Pool{MaxOpenConns: cfg.DBMaxConns}, log)
	if err != nil {
		return nil, nil, err
	}
	cleanup := func() { _ = postgres.Close(db) }
	ropts, err := openSealed(ctx, db, cfg, log)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	oc := OAuth2Config(cfg.OAuth)
	tokenHTTP := provider.NewHTTPClient(cfg.RefreshTimeout)
	if o.App != "" {
		tokenHTTP.Transport = userAgent{base: tokenHTTP.Transport, value: UserAgent(o.App)}
	}
	uopts := usecase.Options{
		Skew:           cfg.RefreshSkew,
		LockWait:       cfg.LockWait,
		RefreshTimeout: cfg.RefreshTimeout,
		CacheSize:      cfg.CacheSize,
		Logger:         log,
		// The process that found the grant revoked tells the operator
		// what to do; tokenctl status shows the state and the reason.
		OnNeedsReauth: func(connectionID, reason string) {
			log.Warn("operator action needed: connect it again with tokenctl import or /oauth/connect",
				"connection", connectionID, "reason", reason,
				"connect_path", "/oauth/connect?connection="+connectionID)
		},
	}
	var target repository.ChangeTarget
	if o.Metrics != nil {
		uopts.Observer = o.Metrics
	}
	refresher := provider.NewRefresher(oc, tokenHTTP, provider.WithAuthStyleStore(repository.NewAuthStyles(db)),
		provider.WithDefaultLifetime(cfg.DefaultLifetime), provider.WithLogger(log))
	uc, err := NewRefreshTokenUseCase(db, provider.NewRetrying(refresher, provider.Policy{Log: log}), uopts, ropts...)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	// The cache is trusted only while this listener hears every change
	// other processes commit.
	target = uc
	if o.Metrics != nil {
		target = listenerGauge{ChangeTarget: uc, m: o.Metrics}
	}
	listenCtx, stopListening := context.WithCancel(context.WithoutCancel(ctx))
	listening := make(chan struct{})
	go func() {
		defer close(listening)
		_ = repository.NewChangeListener(cfg.DatabaseURL, target, log).WithHeartbeat(db, repository.DefaultHeartbeat).Run(listenCtx)
	}()
	closeDB := cleanup
	cleanup = func() {
		stopListening()
		<-listening
		closeDB()
	}
	return &Tokens{
		DB:           db,
		Repository:   repository.NewTokenRepository(db, ropts...),
		RefreshToken: uc,
		Connect:      NewConnectUseCase(db, cfg.LockWait, ropts...),
		OAuth:        oc,
	}, cleanup, nil
}

// NewRefreshTokenUseCase builds the use case on a pool and a refresher.
// repoOpts configure its repository (repository.WithSealer).
func NewRefreshTokenUseCase(db *gorm.DB, r usecase.Refresher, opts usecase.Options, repoOpts ...repository.Option) (*usecase.RefreshTokenUseCase, error) {
	uc, err := usecase.NewRefreshTokenUseCase(repository.NewTokenRepository(db, repoOpts...), r, opts)
	if err != nil {
		return nil, fmt.Errorf("configure refresh: %w", err)
	}
	return uc, nil
}

// NewConnectUseCase builds the use case that stores new grants.
func NewConnectUseCase(db *gorm.DB, lockWait time.Duration, repoOpts ...repository.Option) *usecase.ConnectUseCase {
	return usecase.NewConnectUseCase(repository.NewTokenRepository(db, repoOpts...), nil, lockWait)
}

// OAuth2Config is the x/oauth2 view of the client registration.
func OAuth2Config(c OAuthConfig) *oauth2.Config {
	style, _ := c.authStyle() // checked with the rest of the configuration
	return &oauth2.Config{
		ClientID:     c.ClientID,
		ClientSecret: c.ClientSecret,
		Endpoint:     oauth2.Endpoint{AuthURL: c.AuthURL, TokenURL: c.TokenURL, AuthStyle: style},
		RedirectURL:  c.RedirectURL,
		Scopes:       c.Scopes,
	}
}
