package di

import (
	"cmp"
	"context"
	"log/slog"

	"gorm.io/gorm"

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
	ops, err := newOperator(cfg.Config, db, repo, repository.NewProviderRepository(db, sealer))
	if err != nil {
		return nil, err
	}
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
	env := console.Provider{Profile: o.Profile, TokenURL: o.TokenURL, AuthURL: o.AuthURL, RevokeURL: o.RevocationURL,
		APIBaseURL: cfg.APIBaseURL, ClientID: o.ClientID, AuthStyle: cmp.Or(o.AuthStyle, "auto"), Scopes: o.Scopes,
		Skew: cfg.RefreshSkew, Lifetime: cfg.DefaultLifetime}
	return func(ctx context.Context) ([]console.Provider, error) {
		out := []console.Provider{env}
		for _, name := range registry.Names() {
			sp, ok := registry.Provider(name)
			if !ok {
				continue
			}
			out = append(out, console.Provider{Name: sp.Name, Profile: sp.Profile, TokenURL: sp.TokenURL, AuthURL: sp.AuthURL,
				RevokeURL: sp.RevocationURL, APIBaseURL: sp.APIBaseURL, ClientID: sp.ClientID, AuthStyle: string(sp.AuthStyle),
				Scopes: sp.Scopes, Skew: sp.Skew, Lifetime: sp.DefaultLifetime, KeepAlive: sp.KeepAlive})
		}
		for i := range out {
			learned, err := styles.Load(ctx, out[i].TokenURL, out[i].ClientID)
			if err != nil {
				return nil, err
			}
			out[i].LearnedAuth = learned
		}
		return out, nil
	}
}
