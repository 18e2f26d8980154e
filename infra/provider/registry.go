package provider

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/clientkey"
	"github.com/tokenguard/tokenguard/infra/dpop"
	"github.com/tokenguard/tokenguard/infra/provider/profiles"
)

// ProviderSource lists the stored providers, client secrets opened.
type ProviderSource interface {
	List(ctx context.Context) ([]domain.Provider, error)
}

// Registry redeems refresh tokens at the provider a connection names ("" the
// configuration's), each through its own refresher; safe for concurrent use.
// Providers are read by Load, after Changed (a rotated secret needs no restart),
// an unknown name or a refused client.
type Registry struct {
	env        GrantRefresher
	source     ProviderSource
	build      func(domain.Provider) GrantRefresher
	log        *slog.Logger
	envProfile profiles.Profile

	byName   atomic.Pointer[map[string]registered]
	onChange atomic.Pointer[func(name string)]

	loading  sync.Mutex
	pending  atomic.Bool // a change arrived: read again
	running  atomic.Bool
	lastMiss atomic.Int64
}

type registered struct {
	p         domain.Provider // secrets cleared: ClientSecret kept apart in secret
	secret    domain.Secret
	refresher GrantRefresher
	key       *clientkey.Key
}

const (
	missReadEvery = time.Second // bounds the reads unknown names cause
	loadTimeout   = 10 * time.Second
)

// NewRegistry serves "" with env and source's providers through the
// refresher build makes of each; log may be nil. Call Load before use.
func NewRegistry(env GrantRefresher, source ProviderSource, build func(domain.Provider) GrantRefresher, log *slog.Logger) *Registry {
	r := &Registry{env: env, source: source, build: build, log: cmp.Or(log, slog.Default())}
	r.byName.Store(&map[string]registered{})
	return r
}

// Load reads every stored provider; an error leaves the previous view.
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
	old := r.all()
	next := make(map[string]registered, len(list))
	var changed []string
	for _, p := range list {
		if cur, ok := old[p.Name]; ok && cur.p.Version == p.Version {
			next[p.Name] = cur // keeps what its refresher learned
			continue
		}
		reg := registered{secret: p.ClientSecret, refresher: r.build(p)}
		if reg.key, err = storedKey(p); err != nil {
			r.log.Error("a stored provider's client key cannot be read; its requests carry no assertion", "provider", p.Name)
		}
		p.ClientSecret, p.ClientKey = domain.Secret{}, domain.Secret{}
		reg.p = p
		next[p.Name] = reg
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
	r.byName.Store(&next)
	if fn := r.onChange.Load(); fn != nil {
		for _, name := range changed {
			(*fn)(name)
		}
	}
	return nil
}

// OnChange calls fn with every provider a Load changed, once in effect.
func (r *Registry) OnChange(fn func(name string)) { r.onChange.Store(&fn) }

// Changed reads the providers again in the background; changes meanwhile cause one more read.
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

func (r *Registry) all() map[string]registered { return *r.byName.Load() }

// Only is the registry of a process without stored providers.
func Only(env GrantRefresher) *Registry { return NewRegistry(env, nil, nil, nil) }

// Refresh redeems refreshToken at provider ("" is the configuration's).
func (r *Registry) Refresh(ctx context.Context, provider string, refreshToken domain.Secret) (domain.Grant, error) {
	if provider == "" {
		return r.env.Refresh(ctx, refreshToken)
	}
	reg, err := r.lookup(ctx, provider)
	if err != nil {
		return domain.Grant{}, &domain.ProviderError{Class: domain.EndpointMisconfigured, Err: err}
	}
	g, err := reg.refresher.Refresh(ctx, refreshToken)
	if pe, ok := errors.AsType[*domain.ProviderError](err); ok && clientAuthFailed(pe) {
		if cur, ok := r.all()[provider]; ok && cur.p.Version != reg.p.Version {
			// The settings changed and the refresh token was not looked at: it may go again.
			return cur.refresher.Refresh(ctx, refreshToken)
		}
		r.Changed(provider)
	}
	return g, err
}

// proofKey opens a grant's DPoP key for one call's requests; errors never show the key.
func proofKey(ctx context.Context, key domain.Secret) (context.Context, error) {
	k, err := dpop.ParsePEM([]byte(key.Reveal()))
	if err != nil {
		return nil, &domain.ProviderError{Class: domain.EndpointMisconfigured, Err: fmt.Errorf("the grant's DPoP key: %w", err)}
	}
	return dpop.WithKey(ctx, k), nil
}

// RefreshBound redeems a refresh token bound to key (PEM) with a DPoP proof (RFC 9449 §5).
func (r *Registry) RefreshBound(ctx context.Context, provider string, refreshToken, key domain.Secret) (domain.Grant, error) {
	ctx, err := proofKey(ctx, key)
	if err != nil {
		return domain.Grant{}, err
	}
	return r.Refresh(ctx, provider, refreshToken)
}

// DPoP reports whether provider ("" the configuration's: dflt) requires DPoP-bound grants.
func (r *Registry) DPoP(provider string, dflt bool) bool {
	if provider == "" {
		return dflt
	}
	return r.all()[provider].p.DPoP
}

// lookup is provider, read again if unknown; an error wraps domain.ErrUnknownProvider.
func (r *Registry) lookup(ctx context.Context, provider string) (registered, error) {
	if reg, ok := r.all()[provider]; ok {
		return reg, nil
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
	if reg, ok := r.all()[provider]; ok {
		return reg, nil
	}
	return registered{}, fmt.Errorf("provider %q: %w", provider, domain.ErrUnknownProvider)
}

// refresher is provider's Refresher, under its Retrying if any.
func (r *Registry) refresher(ctx context.Context, provider, what string) (*Refresher, error) {
	ref := r.env
	if provider != "" {
		reg, err := r.lookup(ctx, provider)
		if err != nil {
			return nil, err
		}
		ref = reg.refresher
	}
	if ret, ok := ref.(*Retrying); ok {
		ref = ret.next // pushes and code redemptions are not retried: a person waits, a code is single-use
	}
	out, ok := ref.(*Refresher)
	if !ok {
		return nil, fmt.Errorf("the refresher of provider %q cannot %s", provider, what)
	}
	return out, nil
}

// Provider returns the stored provider called name, without its secret.
func (r *Registry) Provider(name string) (domain.Provider, bool) {
	reg, ok := r.all()[name]
	return reg.p, ok
}

// ClientConfig is the stored provider's registration, secret included, without RedirectURL.
func (r *Registry) ClientConfig(ctx context.Context, name string) (*oauth2.Config, error) {
	reg, err := r.lookup(ctx, name)
	if err != nil {
		return nil, err
	}
	reg.p.ClientSecret = reg.secret // reg is a copy
	return OAuth2Config(reg.p), nil
}

// ClientKeys are the stored providers' client keys, by provider name.
func (r *Registry) ClientKeys() []*clientkey.Key {
	m := r.all()
	var out []*clientkey.Key
	for _, name := range slices.Sorted(maps.Keys(m)) {
		if k := m[name].key; k != nil {
			out = append(out, k)
		}
	}
	return out
}

// Names lists the stored providers as last read, sorted.
func (r *Registry) Names() []string { return slices.Sorted(maps.Keys(r.all())) }

// Skew is provider's own refresh skew; 0: the global one applies.
func (r *Registry) Skew(provider string) time.Duration { return r.all()[provider].p.Skew }

// KeepAlives are the stored providers' own keep-alive intervals, by name.
func (r *Registry) KeepAlives() map[string]time.Duration {
	out := map[string]time.Duration{}
	for name, reg := range r.all() {
		if reg.p.KeepAlive > 0 {
			out[name] = reg.p.KeepAlive
		}
	}
	return out
}

// OAuth2Config is the x/oauth2 view of a stored provider.
func OAuth2Config(p domain.Provider) *oauth2.Config {
	style := AuthStyleOf(string(p.AuthStyle))
	if p.AuthStyle == domain.AuthStylePrivateKeyJWT {
		// The client id goes in the form: never a try in another style.
		style = oauth2.AuthStyleInParams
	}
	return &oauth2.Config{
		ClientID:     p.ClientID,
		ClientSecret: p.ClientSecret.Reveal(),
		Endpoint:     oauth2.Endpoint{AuthURL: p.AuthURL, TokenURL: p.TokenURL, AuthStyle: style},
		Scopes:       slices.Clone(p.Scopes),
	}
}
