package repository_test

import (
	"context"
	"errors"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/internal/waitfor"
	"github.com/tokenguard/tokenguard/migrations"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// inSchema is dbURL with its tables in schema.
func inSchema(t *testing.T, dbURL, schema string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

type heard struct {
	mu       sync.Mutex
	versions []int64
	trusted  chan struct{}
	once     sync.Once
}

func (h *heard) Invalidate(_ string, v int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.versions = append(h.versions, v)
}

func (h *heard) TrustCache(ok bool) {
	if ok {
		h.once.Do(func() { close(h.trusted) })
	}
}

func (h *heard) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.versions)
}

// Two deployments in one database, each in its own schema, never meet:
// the same connection name (and so the same lock key) locks and announces
// apart. Two repositories of one deployment do meet (the control).
func TestDeploymentsInTwoSchemasNeverMeet(t *testing.T) {
	_, db, base := newRepo(t)
	ctx := context.Background()
	repos := map[string]*repository.TokenRepository{}
	urls := map[string]string{}
	for _, schema := range []string{"tenant_a", "tenant_b"} {
		if err := db.Exec("CREATE SCHEMA " + schema).Error; err != nil {
			t.Fatal(err)
		}
		urls[schema] = inSchema(t, base, schema)
		if err := migrations.Up(urls[schema]); err != nil {
			t.Fatal(err)
		}
		repos[schema] = repository.NewTokenRepository(open(t, urls[schema]), tokencrypt.Plaintext{})
		put(t, repos[schema], grantToken("acme", "at-"+schema, "rt-"+schema))
	}
	a, b := repos["tenant_a"], repos["tenant_b"]

	// b hears its own changes and none of a's.
	h := &heard{trusted: make(chan struct{})}
	lctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = repository.NewChangeListener(urls["tenant_b"], h, nil).Run(lctx) }()
	t.Cleanup(func() { stop(); <-done })
	select {
	case <-h.trusted:
	case <-time.After(10 * time.Second):
		t.Fatal("listener never listened")
	}

	release := holdLock(t, a, "acme", func(ctx context.Context, l usecase.LockedStore) error {
		_, err := l.Put(ctx, grantToken("acme", "at-2", "rt-2"))
		return err
	})
	tok, err := b.Get(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	bctx, cancel := context.WithTimeout(ctx, time.Second)
	_, err = b.Store(bctx, tok)
	cancel()
	if err != nil {
		t.Fatalf("tenant_b's write of acme: %v; tenant_a's holder blocked it", err)
	}
	actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = repository.NewTokenRepository(open(t, urls["tenant_a"]), tokencrypt.Plaintext{}).Claim(actx, tok, time.Second)
	cancel()
	if !errors.Is(err, domain.ErrLockTimeout) {
		t.Fatalf("control: a second tenant_a repository's claim under the held lock: %v, want ErrLockTimeout", err)
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, 5*time.Second, "tenant_b's listener heard no change", func() bool { return h.count() >= 1 })
	time.Sleep(300 * time.Millisecond) // room for a stray announcement from tenant_a
	if n := h.count(); n != 1 {
		t.Errorf("tenant_b's listener heard %d changes, want 1 (its own)", n)
	}
	if repository.ChannelFor("public") != repository.ChangeChannel || repository.ChannelFor("tenant_a") == repository.ChannelFor("tenant_b") {
		t.Error("channels: public must keep the fixed one, schemas must differ")
	}
}
