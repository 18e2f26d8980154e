package usecase_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/postgres"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/testdb"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// These tests run the use case on tokens encrypted at rest: a real keyring,
// a real Postgres and the strict sandbox provider.

// countingRefresher counts the calls that reach the real refresher.
type countingRefresher struct {
	next  provider.GrantRefresher
	calls atomic.Int64
}

func (c *countingRefresher) Refresh(ctx context.Context, rt domain.Secret) (domain.Grant, error) {
	c.calls.Add(1)
	return c.next.Refresh(ctx, rt)
}

// later is a clock an hour ahead, so every stored token is due for refresh.
type later struct{}

func (later) Now() time.Time { return time.Now().Add(time.Hour) }

func TestUndecryptableRefreshTokenNeverReachesTheProvider(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	ctx := context.Background()
	p, err := sandbox.New(sandbox.Options{AccessTokenLifespan: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p.Handler())
	t.Cleanup(srv.Close)
	oc := p.OAuth2Config(srv.URL)
	db, err := postgres.Open(ctx, testdb.New(t), postgres.Pool{MaxOpenConns: 4}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = postgres.Close(db) })

	ring := func(spec string) repository.Sealer {
		k, err := tokencrypt.ParseKeyring(spec)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	k1 := "k1=" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0x31}, 32))
	k2 := "k2=" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0x32}, 32))
	useCase := func(opt repository.Sealer) (*usecase.RefreshTokenUseCase, *countingRefresher) {
		t.Helper()
		cr := &countingRefresher{next: provider.NewRefresher(oc, provider.NewHTTPClient(5*time.Second))}
		uc, err := usecase.NewRefreshTokenUseCase(repository.NewTokenRepository(db, opt), provider.Only(cr), usecase.Options{Clock: later{}})
		if err != nil {
			t.Fatal(err)
		}
		return uc, cr
	}

	tok, err := sandbox.Grant(ctx, oc)
	if err != nil {
		t.Fatal(err)
	}
	connect := usecase.NewConnectUseCase(repository.NewTokenRepository(db, ring(k1)), nil, time.Second)
	if _, err := connect.Connect(ctx, "acme", provider.GrantFrom(tok)); err != nil {
		t.Fatal(err)
	}

	// With the right key, refreshing works end to end and the rotated
	// token is stored sealed.
	uc, cr := useCase(ring(k1))
	got, err := uc.Token(ctx, "acme")
	if err != nil || cr.calls.Load() != 1 || p.Stats().Refreshes != 1 {
		t.Fatalf("refresh with the right key: %v (calls %d, provider refreshes %d)", err, cr.calls.Load(), p.Stats().Refreshes)
	}
	var stored string
	db.Raw("SELECT refresh_token FROM tokenguard_tokens").Scan(&stored)
	if !strings.HasPrefix(stored, "tg1:k1:") || !got.RefreshToken.IsZero() {
		t.Fatalf("rotated refresh token stored as %.12s…", stored)
	}

	before := p.Stats()
	for name, c := range map[string]struct {
		opt    repository.Sealer
		tamper string
	}{
		"key not configured": {ring(k2), ""},
		"no keys at all":     {tokencrypt.Plaintext{}, ""},
		"columns swapped":    {ring(k1), "UPDATE tokenguard_tokens SET refresh_token = access_token, access_token = refresh_token"},
		"tag altered": {ring(k1), `UPDATE tokenguard_tokens SET refresh_token =
			left(refresh_token, -1) || CASE WHEN right(refresh_token, 1) = 'A' THEN 'B' ELSE 'A' END`},
	} {
		t.Run(name, func(t *testing.T) {
			if c.tamper != "" {
				tx := db.Begin()
				defer tx.Rollback()
				if err := tx.Exec(c.tamper).Error; err != nil {
					t.Fatal(err)
				}
				uc, cr := func() (*usecase.RefreshTokenUseCase, *countingRefresher) {
					cr := &countingRefresher{next: provider.NewRefresher(oc, provider.NewHTTPClient(5*time.Second))}
					uc, err := usecase.NewRefreshTokenUseCase(repository.NewTokenRepository(tx, c.opt), provider.Only(cr), usecase.Options{Clock: later{}})
					if err != nil {
						t.Fatal(err)
					}
					return uc, cr
				}()
				assertRefused(t, uc, cr)
				return
			}
			uc, cr := useCase(c.opt)
			assertRefused(t, uc, cr)
		})
	}
	if after := p.Stats(); after.Refreshes != before.Refreshes || after.RefreshRejected != before.RefreshRejected {
		t.Errorf("the provider was called: %+v -> %+v", before, after)
	}
	// The stored token is intact: the right key still refreshes it.
	uc, _ = useCase(ring(k2 + "," + k1 + "*"))
	if _, err := uc.Token(ctx, "acme"); err != nil || p.Stats().RefreshReuse != 0 {
		t.Errorf("refresh after the refusals: %v, reuse %d", err, p.Stats().RefreshReuse)
	}
}

func assertRefused(t *testing.T, uc *usecase.RefreshTokenUseCase, cr *countingRefresher) {
	t.Helper()
	_, err := uc.Token(context.Background(), "acme")
	if !errors.Is(err, domain.ErrUndecryptable) || !strings.Contains(err.Error(), "acme") {
		t.Errorf("err = %v, want ErrUndecryptable naming the connection", err)
	}
	if n := cr.calls.Load(); n != 0 {
		t.Errorf("refresher called %d times with an undecryptable token", n)
	}
}
