package apiclient_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/infra/apiclient"
	"github.com/tokenguard/tokenguard/infra/postgres"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/testdb"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// laggingClock runs behind the provider's clock, so the use case believes
// tokens fresh after the provider has expired them: every call then meets
// a 401 that only a refresh cures.
type laggingClock struct{ lag time.Duration }

func (c laggingClock) Now() time.Time { return time.Now().Add(-c.lag) }

// A burst of requests rejected with the same token causes one refresh, and
// every request succeeds on its single retry: real use case, Postgres and
// strict provider.
func TestBurstOf401sCausesOneRefresh(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	p, err := sandbox.New(sandbox.Options{AccessTokenLifespan: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p.Handler())
	t.Cleanup(srv.Close)
	cfg := p.OAuth2Config(srv.URL)
	db, err := postgres.Open(context.Background(), testdb.New(t), postgres.Pool{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = postgres.Close(db) })
	repo := repository.NewTokenRepository(db, tokencrypt.Plaintext{})
	uc, err := usecase.NewRefreshTokenUseCase(repo, provider.Only(provider.NewRefresher(cfg, nil)),
		usecase.Options{Skew: time.Millisecond, Clock: laggingClock{lag: time.Hour}, ForceInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := sandbox.Grant(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := usecase.NewConnectUseCase(repo, nil, time.Second).Connect(context.Background(), "acme", provider.GrantFrom(tok)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // expired at the provider, fresh for the lagging clock

	c, err := apiclient.New(srv.URL, apiclient.TokenClients(uc), apiclient.Options{UserAgent: "tokenguard-test/1"})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	statuses := make(chan int, 20)
	for range 20 {
		wg.Go(func() {
			resp, err := c.Get(context.Background(), "acme", "/resource")
			if err != nil {
				t.Error(err)
				return
			}
			statuses <- resp.StatusCode
		})
	}
	wg.Wait()
	close(statuses)
	for s := range statuses {
		if s != http.StatusOK {
			t.Errorf("a request ended with %d", s)
		}
	}
	st := p.Stats()
	t.Logf("20 requests: provider saw %d 401s, %d refresh(es), %d reuse", st.Resource401, st.Refreshes, st.RefreshReuse)
	if st.Resource401 == 0 || st.Refreshes != 1 || st.RefreshReuse != 0 {
		t.Errorf("want some 401s, exactly 1 refresh and 0 reuse; got %d, %d, %d", st.Resource401, st.Refreshes, st.RefreshReuse)
	}

	// The API keeps answering 401 (the lagging clock keeps serving the
	// refreshed token past its expiry): the rate limit stops the loop.
	time.Sleep(1100 * time.Millisecond)
	for range 5 {
		resp, err := c.Get(context.Background(), "acme", "/resource")
		if err != nil {
			t.Fatal(err)
		}
		_ = resp
	}
	if got := p.Stats().Refreshes; got != 1 {
		t.Errorf("an always-401 API drove %d more refreshes", got-1)
	}
}
