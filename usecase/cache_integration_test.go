package usecase_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenguard/tokenguard/di"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/testworld"
	"github.com/tokenguard/tokenguard/internal/waitfor"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

func TestHotPathMakesNoQuery(t *testing.T) {
	w := testworld.New(t, time.Hour)
	s, queries := w.ListeningStack(t, usecase.Options{})
	w.Connect(t, s)
	s.WaitCached(t, queries)
	before := queries.Load()
	for range 1000 {
		if _, err := s.UC.Token(context.Background(), conn); err != nil {
			t.Fatal(err)
		}
	}
	if n := queries.Load() - before; n != 0 {
		t.Errorf("1000 hot-path calls ran %d queries, want 0", n)
	}
}

func TestOtherProcessRefreshInvalidatesCache(t *testing.T) {
	const lifespan = 4 * time.Second
	w := testworld.New(t, lifespan)
	// a reuses its token until 100ms before expiry; b refreshes at half
	// the lifetime (its skew is capped there), long before a would.
	a, aq := w.ListeningStack(t, usecase.Options{Skew: 100 * time.Millisecond})
	b, _ := w.ListeningStack(t, usecase.Options{Skew: time.Hour})
	w.Connect(t, a)
	a.WaitCached(t, aq)
	old, _ := a.UC.Token(context.Background(), conn)

	waitUntilStale(t, b, time.Hour)
	fresh, err := b.UC.Token(context.Background(), conn)
	if err != nil {
		t.Fatal(err)
	}
	committed := time.Now()
	if fresh.Version <= old.Version {
		t.Fatalf("b did not refresh: version %d", fresh.Version)
	}
	// The old access token is revoked now; a must switch promptly and
	// never present it again.
	var switched time.Duration
	waitfor.Until(t, 2*time.Second-time.Since(committed), "a kept serving the superseded token", func() bool {
		tok, err := a.UC.Token(context.Background(), conn)
		if err != nil {
			t.Fatal(err)
		}
		switched = time.Since(committed)
		return tok.Version >= fresh.Version
	})
	t.Logf("a switched to version %d %v after b committed", fresh.Version, switched)
	for range 200 {
		tok, _ := a.UC.Token(context.Background(), conn)
		if tok.Version < fresh.Version {
			t.Fatalf("went back to version %d after seeing %d", tok.Version, fresh.Version)
		}
	}
	if code := w.CallResource(t, old.AccessToken.Reveal()); code != 401 {
		t.Errorf("the old token still works (%d): the provider would not have caught a stale cache", code)
	}
	if st := w.Provider.Stats(); st.Refreshes != 1 || st.RefreshReuse != 0 {
		t.Errorf("refreshes=%d reuse=%d", st.Refreshes, st.RefreshReuse)
	}
}

func TestListenerLossFallsBackToReadThroughAndRecovers(t *testing.T) {
	w := testworld.New(t, time.Hour)
	a, aq := w.ListeningStack(t, usecase.Options{})
	b := w.Stack(t, usecase.Options{})
	w.Connect(t, a)
	a.WaitCached(t, aq)
	v1, _ := a.UC.Token(context.Background(), conn)

	// Kill the listener's backend.
	var killed int64
	if err := b.DB.Raw("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = ? AND datname = current_database()",
		repository.ListenerApplicationName).Scan(&killed).Error; err != nil || killed != 1 {
		t.Fatalf("terminated %d listener backends: %v", killed, err)
	}
	// While it is gone, a change by another process must be seen at once:
	// the cache reads through. Store a new grant from b right away.
	waitfor.Until(t, 5*time.Second, "the cache kept serving without a listener", func() bool {
		before := aq.Load()
		_, _ = a.UC.Token(context.Background(), conn)
		return aq.Load() > before
	})

	w.Connect(t, b)
	tok, err := a.UC.Token(context.Background(), conn)
	if err != nil {
		t.Fatal(err)
	}
	if tok.Version <= v1.Version {
		t.Errorf("served version %d after version %d was stored", tok.Version, v1.Version+1)
	}
	// The listener comes back and the cache serves again.
	waitfor.Until(t, 5*time.Second, "listener did not reconnect", func() bool {
		var n int64
		b.DB.Raw("SELECT count(*) FROM pg_stat_activity WHERE application_name = ? AND datname = current_database()", repository.ListenerApplicationName).Scan(&n)
		return n == 1
	})

	a.WaitCached(t, aq)
}

// The apps' wiring starts the listener: once it is up, a second Token call
// is a cache hit (the cache counts its lookups in the metrics).
func TestDIWiresTheListener(t *testing.T) {
	w := testworld.New(t, time.Hour)
	cfg, err := di.ConfigFromEnv([]string{
		"DATABASE_URL=" + w.URL, "OAUTH_TOKEN_URL=" + w.OAuth.Endpoint.TokenURL,
		"OAUTH_CLIENT_ID=" + w.OAuth.ClientID, "OAUTH_CLIENT_SECRET=" + w.OAuth.ClientSecret,
	})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	tokens, cleanup, err := di.NewTokens(context.Background(), cfg, nil, di.TokenOptions{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	tok, err := sandbox.Grant(context.Background(), w.OAuth)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tokens.Guard.ConnectUseCase().Connect(context.Background(), conn, provider.GrantFrom(tok)); err != nil {
		t.Fatal(err)
	}
	hits := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "tokenguard_token_cache_lookups_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "result" && l.GetValue() == "hit" {
						return m.GetCounter().GetValue()
					}
				}
			}
		}
		t.Fatal("no cache lookup metric")
		return 0
	}
	if hits() != 0 {
		t.Fatal("cache hits before any Token call")
	}
	waitfor.Until(t, 5*time.Second, "the cache never served a token (listener not up?)", func() bool {
		for range 2 {
			if _, err := tokens.Guard.Token(context.Background(), conn); err != nil {
				t.Fatal(err)
			}
		}
		return hits() > 0
	})
}
