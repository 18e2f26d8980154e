package provider_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/provider"
)

// fakeSource is the tokenguard_providers table as the registry reads it.
type fakeSource struct {
	mu    sync.Mutex
	list  []domain.Provider
	reads int
}

func (s *fakeSource) List(context.Context) ([]domain.Provider, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reads++
	return append([]domain.Provider(nil), s.list...), nil
}

func (s *fakeSource) set(list ...domain.Provider) {
	s.mu.Lock()
	s.list = list
	s.mu.Unlock()
}

// answer is a refresher that answers with its label, or err; during is
// called while the request is out.
type answer struct {
	label  string
	err    error
	during func()
}

func (a *answer) Refresh(context.Context, domain.Secret) (domain.Grant, error) {
	if a.during != nil {
		a.during()
	}
	if a.err != nil {
		return domain.Grant{}, a.err
	}
	return domain.Grant{AccessToken: domain.NewSecret(a.label)}, nil
}

func TestRegistryRoutesByProvider(t *testing.T) {
	ctx := context.Background()
	src := &fakeSource{list: []domain.Provider{{Name: "b", Version: 1}}}
	built := map[string]int{}
	var refreshers sync.Map
	r := provider.NewRegistry(&answer{label: "env"}, src, func(p domain.Provider) provider.GrantRefresher {
		built[p.Name]++
		a := &answer{label: p.Name}
		refreshers.Store(p.Name, a)
		return a
	}, nil)
	if err := r.Load(ctx); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"": "env", "b": "b"} {
		g, err := r.Refresh(ctx, name, domain.NewSecret("rt"))
		if err != nil || g.AccessToken.Reveal() != want {
			t.Errorf("provider %q: %q, %v; want %q", name, g.AccessToken.Reveal(), err, want)
		}
	}
	// Unknown: read once more (it may have been added a moment ago), then
	// a typed error of a class that never touches a grant.
	reads := src.reads
	_, err := r.Refresh(ctx, "ghost", domain.NewSecret("rt"))
	var pe *domain.ProviderError
	if !errors.Is(err, domain.ErrUnknownProvider) || !errors.As(err, &pe) || pe.Class != domain.EndpointMisconfigured || errors.Is(err, domain.ErrGrantRevoked) {
		t.Fatalf("unknown provider: %v", err)
	}
	if src.reads != reads+1 {
		t.Errorf("unknown provider: %d reads of the table, want 1", src.reads-reads)
	}
	src.set(domain.Provider{Name: "b", Version: 1}, domain.Provider{Name: "c", Version: 1})
	if _, err := r.Refresh(ctx, "c", domain.NewSecret("rt")); !errors.Is(err, domain.ErrUnknownProvider) {
		t.Errorf("a second unknown name within missReadEvery read the table again: %v", err)
	}
	// An unchanged version keeps its refresher (what auto learned).
	if err := r.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if built["b"] != 1 || built["c"] != 1 {
		t.Errorf("built %v, want b and c once", built)
	}
	if names := r.Names(); len(names) != 2 || names[0] != "b" || names[1] != "c" {
		t.Errorf("names %v", names)
	}
}

// A request refused as a client (invalid_client) while the provider's
// settings changed is tried once more with the new ones: the refresh token
// was not looked at. One refused with unchanged settings is not.
func TestRegistryRetriesARefusedClientWithNewSettings(t *testing.T) {
	ctx := context.Background()
	src := &fakeSource{list: []domain.Provider{{Name: "b", Version: 1}}}
	refused := &domain.ProviderError{Code: "invalid_client", HTTPStatus: 401, Class: domain.ClientRejected}
	var r *provider.Registry
	calls := map[int64]int{}
	var changed []string
	r = provider.NewRegistry(&answer{label: "env"}, src, func(p domain.Provider) provider.GrantRefresher {
		v := p.Version
		if v == 1 {
			return &answer{err: refused, during: func() {
				calls[v]++
				if calls[v] == 2 { // the secret is rotated while the second request is out
					src.set(domain.Provider{Name: "b", Version: 2})
					if err := r.Load(ctx); err != nil {
						t.Error(err)
					}
				}
			}}
		}
		return &answer{label: "v2", during: func() { calls[v]++ }}
	}, nil)
	r.OnChange(func(name string) { changed = append(changed, name) })
	if err := r.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Refresh(ctx, "b", domain.NewSecret("rt")); !errors.Is(err, domain.ErrClientRejected) {
		t.Fatalf("unchanged settings: %v, want client rejected", err)
	}
	g, err := r.Refresh(ctx, "b", domain.NewSecret("rt"))
	if err != nil || g.AccessToken.Reveal() != "v2" {
		t.Fatalf("settings changed during the request: %q, %v; want the new settings' answer", g.AccessToken.Reveal(), err)
	}
	if calls[1] != 2 || calls[2] != 1 {
		t.Errorf("calls %v, want 2 with version 1, 1 with version 2", calls)
	}
	if len(changed) != 1 || changed[0] != "b" {
		t.Errorf("OnChange heard %v, want [b]", changed)
	}
}
