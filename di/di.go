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
	oc := OAuth2Config(cfg.OAuth)
	uc, err := NewRefreshTokenUseCase(db, provider.NewRetrying(provider.NewRefresher(oc, provider.NewHTTPClient(cfg.RefreshTimeout)), provider.Policy{Log: log}), usecase.Options{
		Skew:           cfg.RefreshSkew,
		LockWait:       cfg.LockWait,
		RefreshTimeout: cfg.RefreshTimeout,
	})
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	// The cache is trusted only while this listener hears every change
	// other processes commit.
	listenCtx, stopListening := context.WithCancel(context.WithoutCancel(ctx))
	listening := make(chan struct{})
	go func() {
		defer close(listening)
		_ = repository.NewChangeListener(cfg.DatabaseURL, uc, log).Run(listenCtx)
	}()
	closeDB := cleanup
	cleanup = func() {
		stopListening()
		<-listening
		closeDB()
	}
	return &Tokens{
		DB:           db,
		Repository:   repository.NewTokenRepository(db),
		RefreshToken: uc,
		Connect:      NewConnectUseCase(db, cfg.LockWait),
		OAuth:        oc,
	}, cleanup, nil
}

// NewRefreshTokenUseCase builds the use case on a pool and a refresher.
func NewRefreshTokenUseCase(db *gorm.DB, r usecase.Refresher, opts usecase.Options) (*usecase.RefreshTokenUseCase, error) {
	uc, err := usecase.NewRefreshTokenUseCase(tokenStore{repository.NewTokenRepository(db)}, r, opts)
	if err != nil {
		return nil, fmt.Errorf("configure refresh: %w", err)
	}
	return uc, nil
}

// NewConnectUseCase builds the use case that stores new grants.
func NewConnectUseCase(db *gorm.DB, lockWait time.Duration) *usecase.ConnectUseCase {
	return usecase.NewConnectUseCase(tokenStore{repository.NewTokenRepository(db)}, nil, lockWait)
}

// OAuth2Config is the x/oauth2 view of the client registration.
func OAuth2Config(c OAuthConfig) *oauth2.Config {
	return &oauth2.Config{
		ClientID:     c.ClientID,
		ClientSecret: c.ClientSecret,
		Endpoint:     oauth2.Endpoint{AuthURL: c.AuthURL, TokenURL: c.TokenURL},
		RedirectURL:  c.RedirectURL,
		Scopes:       c.Scopes,
	}
}

// tokenStore adapts the repository to usecase.TokenStore: the repository
// hands its callback a concrete *LockedTokens and does not know the use
// case's port, which this bridge supplies.
type tokenStore struct {
	*repository.TokenRepository
}

func (s tokenStore) InLock(ctx context.Context, connectionID string, wait, hold time.Duration,
	fn func(context.Context, usecase.LockedStore) error) error {
	return s.TokenRepository.InLock(ctx, connectionID, wait, hold, func(ctx context.Context, l *repository.LockedTokens) error {
		return fn(ctx, l)
	})
}
