package di

import (
	"cmp"
	"context"
	"log/slog"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/httpapi"
	"github.com/tokenguard/tokenguard/infra/httpapi/console"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/repository"
)

// eventsPruneEvery is how often the server trims the connections' history.
const eventsPruneEvery = time.Minute

// newConsole builds srv's operator console: reads through the repository
// as GET /connections does, actions through the library's public API.
func newConsole(cfg AppConfig, a *app, srv *httpapi.Server, keys console.KeyVerifier, log *slog.Logger) *console.Console {
	db := a.tokens.DB
	e := cfg.edges()
	return console.New(console.Deps{
		Keys:        keys,
		Sessions:    consoleSessions{repository.NewConsoleSessions(db)},
		Connections: a.tokens.Repository,
		History:     repository.NewConnectionEvents(db),
		Actions:     a.tokens.Guard,
		Links:       srv,
		Providers: consoleProviders{cfg: cfg, a: a, registry: a.tokens.Guard.ProviderRegistry(),
			styles: repository.NewAuthStyles(db)},
		Secure: e.PublicURL != nil && e.PublicURL.Scheme == "https",
		Log:    log,
	})
}

// consoleSessions is the repository's session store as the console wants it.
type consoleSessions struct{ *repository.ConsoleSessions }

func (s consoleSessions) Lookup(ctx context.Context, token domain.Secret) (console.Session, error) {
	cs, err := s.ConsoleSessions.Lookup(ctx, token)
	return console.Session{KeyID: cs.KeyID, KeyName: cs.KeyName, ExpiresAt: cs.ExpiresAt, Access: cs.Access}, err
}

// consoleProviders lists the OAUTH_* provider and the stored ones, with
// the auth style learned for each.
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
