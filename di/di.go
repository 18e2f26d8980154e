// Package di wires tokenguard from configuration with plain constructors:
// no globals, no container. The apps in cmd/ build everything through it.
package di

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/oauth2"
	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard"
	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/prom"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// Tokens is an app's token layer and the parts under it the apps also use.
type Tokens struct {
	DB           *gorm.DB
	Guard        *tokenguard.Tokens
	RefreshToken *usecase.RefreshTokenUseCase // the batch refreshes ahead with it
	Repository   *repository.TokenRepository  // reads: listing, events, status
	OAuth        *oauth2.Config
}

// TokenOptions say which app the token layer serves and where its metrics go (zero: none).
type TokenOptions struct {
	App             string                // User-Agent tokenguard-<app>/<version> at the token endpoint
	Registry        prometheus.Registerer // nil: no metrics
	ConnectionLabel bool                  // labels the refresh metrics by connection
}

// NewTokens opens (and maybe migrates) the database and builds the token layer. The cleanup waits
// for refreshes in flight (a rotated token must be stored before the pool closes).
func NewTokens(ctx context.Context, cfg Config, log *slog.Logger, o TokenOptions) (*Tokens, func(), error) {
	log = cmp.Or(log, slog.Default())
	if err := cfg.RequireOAuth(); err != nil {
		return nil, nil, err
	}
	if _, err := cfg.sealer(); err != nil { // the keys are checked before anything is opened
		return nil, nil, err
	}
	db, closeDB, err := openDB(ctx, cfg.DatabaseURL, cfg.DBMaxConns, log)
	if err != nil {
		return nil, nil, err
	}
	if cfg.MigrateOnStart {
		if err := migrate(ctx, cfg, db, log); err != nil {
			closeDB()
			return nil, nil, err
		}
	}
	oc := OAuth2Config(cfg.OAuth)
	guard, err := tokenguard.New(db, oc, tokenOptions(cfg, o, log)...)
	switch {
	case errors.Is(err, domain.ErrUndecryptable):
		err = fmt.Errorf("%s cannot decrypt the stored tokens: %w", tokencrypt.EnvKeys, err)
	case errors.Is(err, domain.ErrReadOnlyStore):
		err = fmt.Errorf("DATABASE_URL: %w", err)
	}
	if err != nil {
		closeDB()
		return nil, nil, err
	}
	listenCtx, stopListening := context.WithCancel(context.WithoutCancel(ctx))
	var listening sync.WaitGroup
	listening.Go(func() {
		if err := guard.Run(listenCtx); err != nil {
			log.Error("token change listener stopped", "err", err)
		}
	})
	cleanup := func() {
		// An awaited answer is awaited up to its deadline, or its request stays unresolved.
		closeCtx, cancel := context.WithTimeout(context.Background(), cfg.RefreshTimeout+cfg.AnswerDeadline+usecase.DefaultWriteTimeout)
		if err := guard.Close(closeCtx); err != nil {
			log.Error("stopping with a refresh still in flight", "err", err)
		}
		cancel()
		stopListening()
		listening.Wait()
		closeDB()
	}
	return &Tokens{
		DB:           db,
		Guard:        guard,
		RefreshToken: guard.UseCase(),
		Repository:   guard.Repository(),
		OAuth:        oc,
	}, cleanup, nil
}

// tokenOptions are the tokenguard options cfg and o ask for.
func tokenOptions(cfg Config, o TokenOptions, log *slog.Logger) []tokenguard.Option {
	opts := []tokenguard.Option{
		tokenguard.WithSkew(cfg.RefreshSkew),
		tokenguard.WithLockWait(cfg.LockWait),
		tokenguard.WithRefreshTimeout(cfg.RefreshTimeout),
		tokenguard.WithAnswerDeadline(cfg.AnswerDeadline),
		tokenguard.WithCacheSize(cfg.CacheSize),
		tokenguard.WithMaxRefreshesInFlight(cfg.MaxRefreshesInFlight),
		tokenguard.WithSyncCommit(cfg.SyncCommit),
		tokenguard.WithDefaultLifetime(cfg.DefaultLifetime),
		tokenguard.WithLogger(log),
		tokenguard.WithHTTPClient(agentClient(cfg.AnswerDeadline, o.App)),
		tokenguard.WithListenDSN(cfg.ListenURL()),
		// The process that found the grant revoked tells the operator what to do.
		tokenguard.WithNeedsReauth(func(connection, reason string) {
			log.Warn("operator action needed: connect it again (POST /connect-sessions, or tokenctl import)",
				"connection", connection, "reason", reason)
		}),
	}
	add := func(on bool, o ...tokenguard.Option) {
		if on {
			opts = append(opts, o...)
		}
	}
	oa := cfg.OAuth
	add(oa.DPoP, tokenguard.WithDPoP())
	add(oa.Resource != "", tokenguard.WithResource(oa.Resource))
	add(oa.PAR != "", tokenguard.WithPAR(tokenguard.PARMode(oa.PAR)))
	add(oa.TokenRate != "", tokenguard.WithTokenRate(oa.TokenRate))
	if oa.key != nil {
		opts = append(opts, tokenguard.WithClientKey(oa.key.Signer()))
	}
	add(oa.RevocationURL != "", tokenguard.WithRevocationURL(oa.RevocationURL))
	add(oa.UserInfoURL != "", tokenguard.WithUserInfo(oa.UserInfoURL, oa.UserInfoIDField))
	add(oa.Profile != "", tokenguard.WithProfile(oa.Profile))
	for k, v := range oa.params {
		opts = append(opts, tokenguard.WithProfileParam(k, v))
	}
	add(cfg.EncryptionKeys != "", tokenguard.WithEncryptionKeys(string(cfg.EncryptionKeys)))
	add(cfg.EncryptionKeys != "" && cfg.EncryptionRequired(), tokenguard.WithEncryptionRequired())
	add(o.Registry != nil, prom.WithMetrics(o.Registry))
	add(o.Registry != nil && o.ConnectionLabel, tokenguard.WithMetricsPerConnection())
	return opts
}

// OAuth2Config is the x/oauth2 view of the client registration, as of a stored provider's.
func OAuth2Config(c OAuthConfig) *oauth2.Config {
	oc := provider.OAuth2Config(domain.Provider{ClientID: c.ClientID, ClientSecret: c.ClientSecret,
		AuthURL: c.AuthURL, TokenURL: c.TokenURL, AuthStyle: domain.AuthStyle(c.AuthStyle), Scopes: c.Scopes})
	oc.RedirectURL = c.RedirectURL
	return oc
}
