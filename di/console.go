package di

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/httpapi"
	"github.com/tokenguard/tokenguard/infra/httpapi/console"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

const (
	eventsPruneEvery = time.Minute // trims of the connections' history
	consoleConns     = 2           // the console's pool
)

// newConsole builds srv's operator console on db, a pool of its own, with tokenctl's use cases.
func newConsole(cfg AppConfig, a *app, srv *httpapi.Server, db *gorm.DB, log *slog.Logger) (*console.Console, error) {
	sealer, err := cfg.sealer()
	if err != nil {
		return nil, err
	}
	repo := repository.NewTokenRepository(db, sealer)
	revoker, err := NewRevoker(cfg.Config, db, repository.NewProviderRepository(db, sealer))
	if err != nil {
		return nil, err
	}
	registry := a.tokens.Guard.ProviderRegistry()
	e := cfg.edges()
	return console.New(console.Deps{
		Keys:        repository.NewKeyCache(repository.NewAPIKeys(db), 0),
		Sessions:    consoleSessions{repository.NewConsoleSessions(db)},
		Connections: repo,
		History:     repository.NewConnectionEvents(db),
		Actions: consoleActions{repo: repo, lockWait: cfg.LockWait,
			disconnect: usecase.NewDisconnectUseCase(repo, revoker, cfg.LockWait, cfg.RefreshTimeout)},
		Links:     srv,
		Providers: consoleProviders{cfg: cfg, a: a, registry: registry, styles: repository.NewAuthStyles(db)},
		Secure:    e.PublicURL != nil && e.PublicURL.Scheme == "https",
		Log:       log,
	}), nil
}

// consoleActions are the operator's changes as tokenctl makes them.
type consoleActions struct {
	repo       *repository.TokenRepository
	disconnect *usecase.DisconnectUseCase
	lockWait   time.Duration
}

func (c consoleActions) Reactivate(ctx context.Context, connection string) (int64, error) {
	if err := domain.ValidateName(connection); err != nil {
		return 0, err
	}
	_, version, err := c.repo.Reactivate(ctx, connection, "", c.lockWait)
	if err != nil {
		return 0, fmt.Errorf("reactivate %s: %w", connection, err)
	}
	return version, nil
}

func (c consoleActions) Disconnect(ctx context.Context, connection string, revoke bool) error {
	_, err := c.disconnect.Disconnect(ctx, connection, revoke)
	return err
}

// consoleSessions is the repository's session store as the console wants it.
type consoleSessions struct{ *repository.ConsoleSessions }

func (s consoleSessions) Lookup(ctx context.Context, token domain.Secret) (console.Session, error) {
	cs, err := s.ConsoleSessions.Lookup(ctx, token)
	return console.Session{KeyID: cs.KeyID, KeyName: cs.KeyName, ExpiresAt: cs.ExpiresAt, Access: cs.Access}, err
}

// consoleProviders lists the OAUTH_* provider and the stored ones.
type consoleProviders struct {
	cfg      AppConfig
	a        *app
	registry *provider.Registry
	styles   *repository.AuthStyles
}

func (p consoleProviders) Providers(ctx context.Context) ([]console.Provider, error) {
	oc := p.a.tokens.OAuth
	env := console.Provider{Profile: p.cfg.OAuth.Profile, TokenURL: oc.Endpoint.TokenURL, AuthURL: oc.Endpoint.AuthURL,
		RevokeURL: p.cfg.OAuth.RevocationURL, APIBaseURL: p.cfg.APIBaseURL, ClientID: oc.ClientID,
		AuthStyle: cmp.Or(p.cfg.OAuth.AuthStyle, "auto"), Scopes: p.cfg.OAuth.Scopes,
		Skew: p.cfg.RefreshSkew, Lifetime: p.cfg.DefaultLifetime}
	out := []console.Provider{env}
	for _, name := range p.registry.Names() {
		sp, ok := p.registry.Provider(name)
		if !ok {
			continue
		}
		out = append(out, console.Provider{Name: sp.Name, Profile: sp.Profile, TokenURL: sp.TokenURL, AuthURL: sp.AuthURL,
			RevokeURL: sp.RevocationURL, APIBaseURL: sp.APIBaseURL, ClientID: sp.ClientID, AuthStyle: string(sp.AuthStyle),
			Scopes: sp.Scopes, Skew: sp.Skew, Lifetime: sp.DefaultLifetime, KeepAlive: sp.KeepAlive})
	}
	for i := range out {
		learned, err := p.styles.Load(ctx, out[i].TokenURL, out[i].ClientID)
		if err != nil {
			return nil, err
		}
		out[i].LearnedAuth = learned
	}
	return out, nil
}
