package bench_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/sync/errgroup"
	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/di"
	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/postgres"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/testdb"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// The benchmarks' world: the use case's tests' fixture (usecase/
// integration_test.go, cache_integration_test.go,
// ahead_integration_test.go), the parts of it the benchmarks use, copied
// as they are there: a real Postgres and the strict sandbox provider
// (fosite: rotation on every refresh, the previous access token revoked
// by a refresh, reuse answered with invalid_grant).

func TestMain(m *testing.M) {
	benchPrecheck()
	testdb.Main(m)
}

const conn = "acme"

// world is one provider and one database shared by several stacks.
type world struct {
	url      string
	provider *sandbox.Provider
	srv      *httptest.Server
	oauth    *oauth2.Config
}

// stack is what one OS process of an app holds: its own pool and use case.
type stack struct {
	db   *gorm.DB
	repo *repository.TokenRepository
	uc   *usecase.RefreshTokenUseCase
}

func newWorld(t testing.TB, lifespan time.Duration) *world {
	t.Helper()
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	p, err := sandbox.New(sandbox.Options{AccessTokenLifespan: lifespan})
	if err != nil {
		t.Fatal(err)
	}
	return newWorldWith(t, p)
}

// newWorldWith serves p and gives the world its own database.
func newWorldWith(t testing.TB, p *sandbox.Provider) *world {
	t.Helper()
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	return newWorldOn(t, p, testdb.New(t))
}

// newWorldOn serves p, with the database at url.
func newWorldOn(t testing.TB, p *sandbox.Provider, url string) *world {
	t.Helper()
	srv := httptest.NewServer(p.Handler())
	t.Cleanup(srv.Close)
	return &world{url: url, provider: p, srv: srv, oauth: p.OAuth2Config(srv.URL)}
}

func (w *world) stack(t testing.TB, opts usecase.Options) *stack {
	t.Helper()
	db, err := postgres.Open(context.Background(), w.url, postgres.Pool{MaxOpenConns: 10}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = postgres.Close(db) })
	uc, err := di.NewRefreshTokenUseCase(db, provider.NewRefresher(w.oauth, provider.NewHTTPClient(5*time.Second)), opts)
	if err != nil {
		t.Fatal(err)
	}
	return &stack{db: db, repo: repository.NewTokenRepository(db, tokencrypt.Plaintext{}), uc: uc}
}

// connect runs the real authorization-code flow and stores the first token.
func (w *world) connect(t testing.TB, s *stack) domain.Token {
	t.Helper()
	tok, err := sandbox.Grant(context.Background(), w.oauth)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := di.NewConnectUseCase(s.db, time.Second).Connect(context.Background(), conn, provider.GrantFrom(tok))
	if err != nil {
		t.Fatal(err)
	}
	return stored
}

func mustGet(t testing.TB, s *stack) domain.Token {
	t.Helper()
	tok, err := s.repo.Get(context.Background(), conn)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// countQueries counts every statement db runs.
func countQueries(t testing.TB, db *gorm.DB) *atomic.Int64 {
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

// listeningStack is a stack wired like di.NewTokens: its cache is fed by a
// change listener on its own connection.
func (w *world) listeningStack(t testing.TB, opts usecase.Options) (*stack, *atomic.Int64) {
	t.Helper()
	s := w.stack(t, opts)
	queries := countQueries(t, s.db)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = repository.NewChangeListener(w.url, s.uc, nil).Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return s, queries
}

// waitCached polls until Token is served without a query.
func waitCached(t testing.TB, s *stack, queries *atomic.Int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := s.uc.Token(context.Background(), conn); err != nil {
			t.Fatal(err)
		}
		before := queries.Load()
		if _, err := s.uc.Token(context.Background(), conn); err != nil {
			t.Fatal(err)
		}
		if queries.Load() == before {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("the cache never served a token (listener not up?)")
}

func connName(i int) string { return "conn-" + strconv.Itoa(i) }

// seedConnections stores n connections with distinct long-lived tokens in
// one statement per table (the provider is not involved).
func seedConnections(tb testing.TB, s *stack, n int) {
	tb.Helper()
	err := s.db.Exec(`INSERT INTO tokenguard_connections (name) SELECT 'conn-' || g FROM generate_series(0, ?) g`, n-1).Error
	if err == nil {
		err = s.db.Exec(`INSERT INTO tokenguard_tokens (connection_id, access_token, refresh_token, expiry, obtained_at, version)
			SELECT id, md5(random()::text) || md5(random()::text), md5(random()::text), now() + interval '1 hour', now(), 1
			FROM tokenguard_connections WHERE name LIKE 'conn-%'`).Error
	}
	if err != nil {
		tb.Fatal(err)
	}
}

// connectMany grants n connections named ahead-0..n-1 through the real
// authorization-code flow and stores them.
func connectMany(tb testing.TB, w *world, s *stack, n int) []string {
	tb.Helper()
	names := make([]string, n)
	connect := di.NewConnectUseCase(s.db, 10*time.Second)
	var g errgroup.Group
	g.SetLimit(32)
	for i := range names {
		names[i] = fmt.Sprintf("ahead-%d", i)
		g.Go(func() error {
			tok, err := sandbox.Grant(context.Background(), w.oauth)
			if err != nil {
				return err
			}
			_, err = connect.Connect(context.Background(), names[i], provider.GrantFrom(tok))
			return err
		})
	}
	if err := g.Wait(); err != nil {
		tb.Fatal(err)
	}
	return names
}
