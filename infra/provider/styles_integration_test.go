package provider_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/postgres"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/internal/testdb"
	"github.com/tokenguard/tokenguard/repository"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// The style auto learns is stored in Postgres: a new Refresher on a new
// pool (another process, a restart) starts with it and does not probe.
func TestLearnedStylePersistsInPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	dbURL := testdb.New(t)
	var mu sync.Mutex
	var styles []string
	// A token endpoint that takes the client only in the form body.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		_, _, basic := r.BasicAuth()
		style := "params"
		if basic {
			style = "header"
		}
		mu.Lock()
		styles = append(styles, style)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if basic || r.PostForm.Get("client_secret") != "s" {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":"invalid_client"}`))
			return
		}
		_, _ = w.Write([]byte(`{"access_token":"at","expires_in":60}`))
	}))
	defer srv.Close()
	cfg := &oauth2.Config{ClientID: "c", ClientSecret: "s", Endpoint: oauth2.Endpoint{TokenURL: srv.URL + "/token"}}
	requests := func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := append([]string(nil), styles...)
		styles = nil
		return out
	}
	process := func() (*provider.Refresher, *repository.AuthStyles) {
		db, err := postgres.Open(context.Background(), dbURL, postgres.Pool{MaxOpenConns: 2}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = postgres.Close(db) })
		store := repository.NewAuthStyles(db)
		return provider.NewRefresher(cfg, nil, provider.WithAuthStyleStore(store)), store
	}
	refresh := func(r *provider.Refresher) {
		t.Helper()
		if _, err := r.Refresh(context.Background(), domain.NewSecret("rt")); err != nil {
			t.Fatal(err)
		}
	}

	first, store := process()
	refresh(first)
	if got := requests(); len(got) != 2 || got[0] != "header" || got[1] != "params" {
		t.Fatalf("first refresh: requests %v, want [header params]", got)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		s, err := store.Load(context.Background(), cfg.Endpoint.TokenURL, "c")
		if err == nil && s == provider.StyleParams {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stored style %q, %v; want params", s, err)
		}
	}

	second, _ := process()
	refresh(second)
	if got := requests(); len(got) != 1 || got[0] != "params" {
		t.Errorf("new process: requests %v, want [params]", got)
	}
	// Another client of the same token URL learns for itself.
	other := *cfg
	other.ClientID = "c2"
	refresh(provider.NewRefresher(&other, nil, provider.WithAuthStyleStore(store)))
	if got := requests(); len(got) != 2 {
		t.Errorf("another client: requests %v, want [header params]", got)
	}
}
