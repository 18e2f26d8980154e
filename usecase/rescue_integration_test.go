package usecase_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/postgres"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/infra/tracing"
	"github.com/tokenguard/tokenguard/internal/testworld"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

// killAfterAnswer is the real refresher, except that right after the
// provider answered it terminates every other backend of the database,
// among them the pool connection the write is about to use: the crash
// window between the provider's rotation and our commit.
type killAfterAnswer struct {
	next  provider.GrantRefresher
	admin *gorm.DB
	t     *testing.T
	mu    sync.Mutex
	grant domain.Grant
	kills int
}

func (k *killAfterAnswer) Refresh(ctx context.Context, rt domain.Secret) (domain.Grant, error) {
	g, err := k.next.Refresh(ctx, rt)
	if err != nil {
		return g, err
	}
	var n int64
	if err := k.admin.Raw(`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&n).Error; err != nil {
		k.t.Error(err)
	}
	k.mu.Lock()
	k.grant, k.kills = g, k.kills+int(n)
	k.mu.Unlock()
	return g, nil
}

func TestRotatedTokenSurvivesBackendTerminatedAfterProviderAnswered(t *testing.T) {
	w := testworld.New(t, time.Second)
	admin := w.Stack(t, usecase.Options{})
	w.Connect(t, admin)

	db, err := postgres.Open(context.Background(), w.URL, postgres.Pool{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = postgres.Close(db) })
	var logs syncBuffer
	killer := &killAfterAnswer{next: provider.NewRefresher(w.OAuth, nil), admin: admin.DB, t: t}
	spans := tracetest.NewSpanRecorder()
	repo := repository.NewTokenRepository(db, tokencrypt.Plaintext{})
	uc, err := usecase.NewRefreshTokenUseCase(repo, provider.Only(killer), usecase.Options{
		Skew: 500 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Tracer: tracing.New(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))),
	})
	if err != nil {
		t.Fatal(err)
	}
	waitUntilStale(t, admin, 500*time.Millisecond)

	tok, err := uc.Token(context.Background(), conn)
	if err != nil {
		t.Fatalf("Token: %v\nlogs:\n%s", err, logs.String())
	}
	if killer.kills < 1 {
		t.Fatalf("terminated %d backends, want the writer's", killer.kills)
	}
	stored := admin.MustGet(t)
	t.Logf("backend killed after the provider answered; logs:\n%s", logs.String())
	if !stored.RefreshToken.Equal(killer.grant.RefreshToken) || !tok.AccessToken.Equal(killer.grant.AccessToken) {
		t.Fatal("the rotated token was not persisted")
	}
	if !strings.Contains(logs.String(), "rotated refresh token not persisted") ||
		!strings.Contains(logs.String(), "rotated refresh token persisted on retry") {
		t.Error("the failed first write and the rescue were not logged")
	}
	// The trace shows the failed commit and the rescue that stored it.
	ended := spans.Ended()
	commit, rescue := oneSpan(t, ended, string(usecase.StepCommit)), oneSpan(t, ended, string(usecase.StepRescue))
	if commit.Status().Code != codes.Error || rescue.Status().Code == codes.Error ||
		spanAttr(rescue, "tokenguard.version.after") != stored.Version || spanAttr(rescue, "tokenguard.outcome") != "ok" {
		t.Errorf("commit %v, rescue %v %v: want the commit failed, the rescue storing version %d",
			commit.Status(), rescue.Status(), rescue.Attributes(), stored.Version)
	}
	if refresh := oneSpan(t, ended, string(usecase.StepRefresh)); rescue.Parent().SpanID() != refresh.SpanContext().SpanID() {
		t.Error("the rescue is not under the refresh")
	}
	checkNoSecret(t, ended, killer.grant.AccessToken.Reveal(), killer.grant.RefreshToken.Reveal(), w.OAuth.ClientSecret)
	if code := w.CallResource(t, tok.AccessToken.Reveal()); code != http.StatusOK {
		t.Errorf("rescued token answered %d", code)
	}
	if st := w.Provider.Stats(); st.Refreshes != 1 || st.RefreshReuse != 0 {
		t.Errorf("provider: %d refreshes, %d reuse", st.Refreshes, st.RefreshReuse)
	}
	// And the connection keeps working: the next refresh redeems the
	// rescued refresh token.
	waitUntilStale(t, admin, 500*time.Millisecond)
	if _, err := admin.UC.Token(context.Background(), conn); err != nil {
		t.Errorf("refresh after the rescue: %v", err)
	}
	for _, secret := range []string{killer.grant.AccessToken.Reveal(), killer.grant.RefreshToken.Reveal()} {
		if strings.Contains(logs.String(), secret) {
			t.Error("a token reached the log")
		}
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
