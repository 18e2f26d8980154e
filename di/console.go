package di

import (
	"cmp"
	"context"
	"log/slog"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/httpapi"
	"github.com/tokenguard/tokenguard/infra/httpapi/console"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/repository"
)

// newConsole builds srv's operator console on db, a pool of its own, with tokenctl's use cases.
func newConsole(cfg AppConfig, a *app, srv *httpapi.Server, db *gorm.DB, log *slog.Logger) (*console.Console, error) {
	sealer, err := cfg.sealer()
	if err != nil {
		return nil, err
	}
	repo := repository.NewTokenRepository(db, sealer)
	ops := newOperator(cfg.Config, db, repo, repository.NewProviderRepository(db, sealer))
	e := cfg.edges()
	return console.New(console.Deps{
		Keys:        repository.NewKeyCache(repository.NewAPIKeys(db), 0),
		Sessions:    repository.NewConsoleSessions(db),
		Connections: repo,
		History:     repository.NewConnectionEvents(db),
		Actions:     ops,
		Links:       srv,
		Providers:   consoleProviders(cfg, a.tokens.Guard.ProviderRegistry(), repository.NewAuthStyles(db)),
		Secure:      e.PublicURL != nil && e.PublicURL.Scheme == "https",
		Log:         log,
	}), nil
}

// consoleProviders lists the OAUTH_* provider and the stored ones.
func consoleProviders(cfg AppConfig, registry *provider.Registry, styles *repository.AuthStyles) func(context.Context) ([]console.Provider, error) {
	o := cfg.OAuth
	env := domain.Provider{Profile: o.Profile, TokenURL: o.TokenURL, AuthURL: o.AuthURL, RevocationURL: o.RevocationURL,
		APIBaseURL: cfg.APIBaseURL, ClientID: o.ClientID, AuthStyle: domain.AuthStyle(cmp.Or(o.AuthStyle, "auto")), Scopes: o.Scopes,
		Skew: cfg.RefreshSkew, DefaultLifetime: cfg.DefaultLifetime}
	return func(ctx context.Context) ([]console.Provider, error) {
		ps := []domain.Provider{env}
		for _, name := range registry.Names() {
			if sp, ok := registry.Provider(name); ok {
				ps = append(ps, sp)
			}
		}
		out := make([]console.Provider, len(ps))
		for i, p := range ps {
			learned, err := styles.Load(ctx, p.TokenURL, p.ClientID)
			if err != nil {
				return nil, err
			}
			out[i] = console.Provider{Name: p.Name, Profile: p.Profile, TokenURL: p.TokenURL, AuthURL: p.AuthURL, RevokeURL: p.RevocationURL,
				APIBaseURL: p.APIBaseURL, ClientID: p.ClientID, AuthStyle: string(p.AuthStyle), LearnedAuth: learned, Scopes: p.Scopes,
				Skew: p.Skew, Lifetime: p.DefaultLifetime, KeepAlive: p.KeepAlive}
		}
		return out, nil
	}
}
