package provider

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/clientkey"
	"github.com/tokenguard/tokenguard/infra/provider/profiles"
)

// ProviderSource lists the stored providers, client secrets opened;
// repository.ProviderRepository is one.
type ProviderSource interface {
	List(ctx context.Context) ([]domain.Provider, error)
}

// Registry redeems refresh tokens at the provider a connection names
// (usecase.Refresher): "" at the provider of the process's configuration,
// any other name at that stored provider, each through a refresher of its
// own. It is safe for concurrent use.
//
// The stored providers are read by Load and again after Changed (on every
// NOTIFY on tokenguard_providers, and after each reconnection), so a
// rotated client secret is used without a restart; a provider whose
// version did not change keeps its refresher. An unknown name makes it read
// again at once (at most once per missReadEvery; the provider may have been
// added a moment ago), then is domain.ErrUnknownProvider: no grant is
// touched. A provider that rejects the client makes it read again in the
// background, in case a change was missed.
type Registry struct {
	env        GrantRefresher
	source     ProviderSource
	build      func(domain.Provider) GrantRefresher
	log        *slog.Logger
	envProfile profiles.Profile // of the configuration's provider

	state    atomic.Pointer[registryState]
	onChange atomic.Pointer[func(name string)]

	loading  sync.Mutex  // one Load at a time
	pending  atomic.Bool // a change arrived: read again
	running  atomic.Bool // a background read is under way
	lastMiss atomic.Int64
}

type registryState struct {
	byName map[string]registered
}

type registered struct {
	p         domain.Provider // ClientSecret cleared: kept apart in secret
	secret    domain.Secret   // for the connect flow's code exchange
	refresher GrantRefresher
	key       *clientkey.Key // private_key_jwt; nil for the other styles
}

// missReadEvery bounds the reads an unknown provider name can cause.
const missReadEvery = time.Second

// loadTimeout bounds one read of the providers.
const loadTimeout = 10 * time.Second

// NewRegistry serves "" with env and the providers of source, each with
// the refresher build makes of it (its HTTP client, auth-style store and
// retry policy). log may be nil. Call Load before use: until then only ""
// is known.
func NewRegistry(env GrantRefresher, source ProviderSource, build func(domain.Provider) GrantRefresher, log *slog.Logger) *Registry {
	if log == nil {
		log = slog.Default()
	}
	r := &Registry{env: env, source: source, build: build, log: log}
	r.state.Store(&registryState{byName: map[string]registered{}})
	return r
}

// Load reads every stored provider and replaces the registry's view of
// them. Errors (the database is down, a secret cannot be decrypted) leave
// the previous view in place.
func (r *Registry) Load(ctx context.Context) error {
	r.loading.Lock()
	defer r.loading.Unlock()
	if r.source == nil {
		return nil
	}
	list, err := r.source.List(ctx)
	if err != nil {
		return fmt.Errorf("load providers: %w", err)
	}
	old := r.state.Load().byName
	next := make(map[string]registered, len(list))
	var changed []string
	for _, p := range list {
		if cur, ok := old[p.Name]; ok && cur.p.Version == p.Version {
			next[p.Name] = cur // keeps what its refresher learned
			continue
		}
		ref := r.build(p)
		secret := p.ClientSecret
		var key *clientkey.Key
		if !p.ClientKey.IsZero() {
			if key, err = clientkey.ParsePEM([]byte(p.ClientKey.Reveal())); err != nil {
				r.log.Error("a stored provider's client key cannot be read; its requests carry no assertion", "provider", p.Name)
			}
		}
		p.ClientSecret, p.ClientKey = domain.Secret{}, domain.Secret{}
		next[p.Name] = registered{p: p, secret: secret, refresher: ref, key: key}
		if _, ok := old[p.Name]; ok {
			r.log.Info("provider changed; its connections use the new settings from their next refresh",
				"provider", p.Name, "version", p.Version)
			changed = append(changed, p.Name)
		}
	}
	for name := range old {
		if _, ok := next[name]; !ok {
			r.log.Info("provider removed", "provider", name)
		}
	}
	r.state.Store(&registryState{byName: next})
	if fn := r.onChange.Load(); fn != nil {
		for _, name := range changed {
			(*fn)(name)
		}
	}
	return nil
}

// OnChange calls fn with the name of every provider whose settings a Load
// found changed, right after they took effect (the use case reopens the
// provider's client gate: new settings deserve a try at once).
func (r *Registry) OnChange(fn func(name string)) { r.onChange.Store(&fn) }

// Changed says a provider was added, changed or removed (name "" when
// unknown, after a gap in the change feed). It reads the providers again
// in the background and returns at once; changes that arrive meanwhile
// cause one more read, not one each.
func (r *Registry) Changed(string) {
	r.pending.Store(true)
	if !r.running.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer r.running.Store(false)
		for r.pending.Swap(false) {
			ctx, cancel := context.WithTimeout(context.Background(), loadTimeout)
			if err := r.Load(ctx); err != nil {
				r.log.Error("providers not reloaded; the previous settings stay in use", "err", err)
			}
			cancel()
		}
	}()
}

// Only is the registry of a process without stored providers: every
// connection that names one gets domain.ErrUnknownProvider.
func Only(env GrantRefresher) *Registry { return NewRegistry(env, nil, nil, nil) }

// Refresh redeems refreshToken at provider ("" is the configuration's).
func (r *Registry) Refresh(ctx context.Context, provider string, refreshToken domain.Secret) (domain.Grant, error) {
	if provider == "" {
		return r.env.Refresh(ctx, refreshToken)
	}
	reg, ok := r.lookup(ctx, provider)
	if !ok {
		return domain.Grant{}, &domain.ProviderError{Class: domain.EndpointMisconfigured,
			Err: fmt.Errorf("provider %q: %w", provider, domain.ErrUnknownProvider)}
	}
	g, err := reg.refresher.Refresh(ctx, refreshToken)
	var pe *domain.ProviderError
	if errors.As(err, &pe) && clientAuthFailed(pe) {
		if cur, ok := r.state.Load().byName[provider]; ok && cur.p.Version != reg.p.Version {
			// The settings changed while the request was out (a rotated
			// client secret), and the refresh token was not looked at: it
			// may go once more, with the new settings.
			return cur.refresher.Refresh(ctx, refreshToken)
		}
		// A rotated secret whose announcement this process missed is
		// picked up by the next read.
		r.Changed(provider)
	}
	return g, err
}

// lookup finds provider, reading the providers once more for a name the
// registry does not know, unless it did so less than missReadEvery ago.
func (r *Registry) lookup(ctx context.Context, provider string) (registered, bool) {
	if reg, ok := r.state.Load().byName[provider]; ok {
		return reg, true
	}
	now := time.Now().UnixNano()
	last := r.lastMiss.Load()
	if now-last >= int64(missReadEvery) && r.lastMiss.CompareAndSwap(last, now) {
		lctx, cancel := context.WithTimeout(ctx, loadTimeout)
		err := r.Load(lctx)
		cancel()
		if err != nil {
			r.log.Warn("could not read the providers for an unknown name", "provider", provider, "err", err)
		}
	}
	reg, ok := r.state.Load().byName[provider]
	return reg, ok
}

// Provider returns the stored provider called name as last read, without
// its client secret.
func (r *Registry) Provider(name string) (domain.Provider, bool) {
	reg, ok := r.state.Load().byName[name]
	return reg.p, ok
}

// ClientConfig is the client registration of the stored provider called
// name, secret included, for the connect flow (authorization URL, code
// exchange); its RedirectURL is left to the caller. An unknown name is
// read again once, as a refresh does, then domain.ErrUnknownProvider.
func (r *Registry) ClientConfig(ctx context.Context, name string) (*oauth2.Config, error) {
	reg, ok := r.lookup(ctx, name)
	if !ok {
		return nil, fmt.Errorf("provider %q: %w", name, domain.ErrUnknownProvider)
	}
	p := reg.p
	p.ClientSecret = reg.secret
	return OAuth2Config(p), nil
}

// ClientKeys are the client keys (private_key_jwt) of the stored
// providers as last read, by provider name.
func (r *Registry) ClientKeys() []*clientkey.Key {
	var out []*clientkey.Key
	for _, name := range r.Names() {
		if k := r.state.Load().byName[name].key; k != nil {
			out = append(out, k)
		}
	}
	return out
}

// Names lists the stored providers as last read, sorted.
func (r *Registry) Names() []string {
	m := r.state.Load().byName
	out := make([]string, 0, len(m))
	for name := range m {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// Skew is the refresh skew of provider's connections, 0 when it has none
// of its own (or is unknown): the caller's global one applies.
func (r *Registry) Skew(provider string) time.Duration {
	return r.state.Load().byName[provider].p.Skew
}

// KeepAlives are the keep-alive intervals of the stored providers that
// have one of their own (tokenctl provider add --keep-alive), by name.
func (r *Registry) KeepAlives() map[string]time.Duration {
	out := map[string]time.Duration{}
	for name, reg := range r.state.Load().byName {
		if reg.p.KeepAlive > 0 {
			out[name] = reg.p.KeepAlive
		}
	}
	return out
}

// OAuth2Config is the x/oauth2 view of a stored provider.
func OAuth2Config(p domain.Provider) *oauth2.Config {
	style := styleFromName(string(p.AuthStyle))
	if p.AuthStyle == domain.AuthStylePrivateKeyJWT {
		// The assertion replaces the secret, the client id in the form
		// (RFC 7523 §2.2): never a second try in another style.
		style = oauth2.AuthStyleInParams
	}
	return &oauth2.Config{
		ClientID:     p.ClientID,
		ClientSecret: p.ClientSecret.Reveal(),
		Endpoint:     oauth2.Endpoint{AuthURL: p.AuthURL, TokenURL: p.TokenURL, AuthStyle: style},
		Scopes:       slices.Clone(p.Scopes),
	}
}
