// Package testworld is the refresh path's test world: one real Postgres
// database and the strict sandbox provider (fosite: rotation on every
// refresh, the previous access token revoked by a refresh, reuse answered
// with invalid_grant), shared by several stacks, each what one OS process
// of an app holds. The use case's tests and the benchmarks (tools/bench)
// build on it.
package testworld

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/sync/errgroup"
	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/postgres"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/testdb"
	"github.com/tokenguard/tokenguard/internal/waitfor"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// Conn is the connection Connect grants.
const Conn = "acme"

// World is one provider and one database shared by several stacks.
type World struct {
	URL      string // the database's
	Provider *sandbox.Provider
	Server   *httptest.Server // serves Provider
	OAuth    *oauth2.Config   // Provider's, at Server
}

// Stack is what one OS process of an app holds: its own pool and use case.
type Stack struct {
	DB   *gorm.DB
	Repo *repository.TokenRepository
	UC   *usecase.RefreshTokenUseCase
}

// New is a world with a sandbox provider whose access tokens live for
// lifespan, and a database of its own. It skips the test with -short.
func New(t testing.TB, lifespan time.Duration) *World {
	t.Helper()
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	p, err := sandbox.New(sandbox.Options{AccessTokenLifespan: lifespan})
	if err != nil {
		t.Fatal(err)
	}
	return With(t, p)
}

// With serves p and gives the world its own database.
func With(t testing.TB, p *sandbox.Provider) *World {
	t.Helper()
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	return On(t, p, testdb.New(t))
}

// On serves p, with the database at url.
func On(t testing.TB, p *sandbox.Provider, url string) *World {
	t.Helper()
	srv := httptest.NewServer(p.Handler())
	t.Cleanup(srv.Close)
	return &World{URL: url, Provider: p, Server: srv, OAuth: p.OAuth2Config(srv.URL)}
}

// Stack opens a pool of 10 and a use case refreshing at the world's
// provider.
func (w *World) Stack(t testing.TB, opts usecase.Options) *Stack {
	t.Helper()
	return w.StackWith(t, provider.NewRefresher(w.OAuth, provider.NewHTTPClient(5*time.Second)), opts)
}

// StackWith is Stack with a refresher of the test's choosing.
func (w *World) StackWith(t testing.TB, r provider.GrantRefresher, opts usecase.Options) *Stack {
	t.Helper()
	db, err := postgres.Open(context.Background(), w.URL, postgres.Pool{MaxOpenConns: 10}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = postgres.Close(db) })
	repo := repository.NewTokenRepository(db, tokencrypt.Plaintext{})
	uc, err := usecase.NewRefreshTokenUseCase(repo, provider.Only(r), opts)
	if err != nil {
		t.Fatal(err)
	}
	return &Stack{DB: db, Repo: repo, UC: uc}
}

// ListeningStack is a stack wired like di.NewTokens: its cache is fed by a
// change listener on its own connection. The counter counts every
// statement its pool runs.
func (w *World) ListeningStack(t testing.TB, opts usecase.Options) (*Stack, *atomic.Int64) {
	t.Helper()
	s := w.Stack(t, opts)
	queries := CountQueries(t, s.DB)
	w.Listen(t, s)
	return s, queries
}

// Listen feeds s's cache from a change listener on its own connection
// until the test ends.
func (w *World) Listen(t testing.TB, s *Stack) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = repository.NewChangeListener(w.URL, s.UC, nil).Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// Connect runs the real authorization-code flow and stores the first
// token of Conn.
func (w *World) Connect(t testing.TB, s *Stack) domain.Token {
	t.Helper()
	tok, err := sandbox.Grant(context.Background(), w.OAuth)
	if err != nil {
		t.Fatal(err)
	}
	connect := usecase.NewConnectUseCase(repository.NewTokenRepository(s.DB, tokencrypt.Plaintext{}), nil, time.Second)
	stored, err := connect.Connect(context.Background(), Conn, provider.GrantFrom(tok))
	if err != nil {
		t.Fatal(err)
	}
	return stored
}

// ConnectMany grants n connections named ahead-0..n-1 through the real
// authorization-code flow and stores them.
func (w *World) ConnectMany(t testing.TB, s *Stack, n int) []string {
	t.Helper()
	names := make([]string, n)
	connect := usecase.NewConnectUseCase(repository.NewTokenRepository(s.DB, tokencrypt.Plaintext{}), nil, 10*time.Second)
	var g errgroup.Group
	g.SetLimit(32)
	for i := range names {
		names[i] = fmt.Sprintf("ahead-%d", i)
		g.Go(func() error {
			tok, err := sandbox.Grant(context.Background(), w.OAuth)
			if err != nil {
				return err
			}
			_, err = connect.Connect(context.Background(), names[i], provider.GrantFrom(tok))
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	return names
}

// CallResource calls the provider's protected API with accessToken and
// returns the status code (0 when the call failed). It may be called from
// any goroutine.
func (w *World) CallResource(t testing.TB, accessToken string) int {
	req, _ := http.NewRequest(http.MethodGet, w.Server.URL+"/resource", nil)
	req.Header.Set("Authorization", "Bearer "+accessToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("resource: %v", err)
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// MustGet reads Conn's stored token.
func (s *Stack) MustGet(t testing.TB) domain.Token {
	t.Helper()
	tok, err := s.Repo.Get(context.Background(), Conn)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// WaitCached waits until Conn's token is served without a query.
func (s *Stack) WaitCached(t testing.TB, queries *atomic.Int64) {
	t.Helper()
	waitfor.Until(t, 5*time.Second, "the cache never served a token (listener not up?)", func() bool {
		if _, err := s.UC.Token(context.Background(), Conn); err != nil {
			t.Fatal(err)
		}
		before := queries.Load()
		if _, err := s.UC.Token(context.Background(), Conn); err != nil {
			t.Fatal(err)
		}
		return queries.Load() == before
	})
}

// CountQueries counts every statement db runs.
func CountQueries(t testing.TB, db *gorm.DB) *atomic.Int64 {
	t.Helper()
	var n atomic.Int64
	inc := func(*gorm.DB) { n.Add(1) }
	cb := db.Callback()
	for name, err := range map[string]error{
		"query": cb.Query().Before("gorm:query").Register("test:count", inc),
		"raw":   cb.Raw().Before("gorm:raw").Register("test:count", inc),
		"row":   cb.Row().Before("gorm:row").Register("test:count", inc),
	} {
		if err != nil {
			t.Fatalf("register %s callback: %v", name, err)
		}
	}
	return &n
}
