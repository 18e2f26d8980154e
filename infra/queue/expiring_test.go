package queue

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// storeToken writes connection name's token row as a grant would, its
// refresh token expiring in refreshIn.
func storeToken(t *testing.T, pool *pgxpool.Pool, name string, refreshIn time.Duration) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
WITH c AS (INSERT INTO tokenguard_connections (name) VALUES ($1) RETURNING id)
INSERT INTO tokenguard_tokens (connection_id, access_token, refresh_token, expiry, refresh_expiry, obtained_at, version, granted_at)
SELECT c.id, 'at', 'rt', now() + interval '1 hour', now() + $2 * interval '1 second', now(), 1, now() FROM c`,
		name, int64(refreshIn/time.Second))
	if err != nil {
		t.Fatal(err)
	}
}

// An absolute refresh expiry within the notice is announced by one
// connection.expiring webhook, however many workers look, and only once
// per grant; one further off is not announced. The control: a new grant of
// the connection is announced again, so the count is the announcements'.
func TestExpiringAnnouncedOncePerGrant(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	ctx := context.Background()
	pool, err := OpenPool(ctx, testdb.New(t), 8)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	const notice = 14 * 24 * time.Hour
	storeToken(t, pool, "soon", notice-time.Hour) // an absolute expiry 14 days ahead
	storeToken(t, pool, "later", notice+24*time.Hour)

	var (
		mu        sync.Mutex
		delivered []WebhookEvent
	)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var e WebhookEvent
		if err := json.Unmarshal(body, &e); err != nil {
			t.Errorf("webhook body: %v", err)
		}
		mu.Lock()
		delivered = append(delivered, e)
		mu.Unlock()
	}))
	t.Cleanup(hook.Close)
	log := slog.New(slog.DiscardHandler)
	w, err := NewWorker(pool, HandlerFunc(func(context.Context, EventArgs) error { return nil }), WorkerOptions{
		Webhook:        &Webhook{URL: hook.URL, Secret: domain.NewSecret("whsec_test")},
		ExpiringNotice: notice,
	}, log)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	defer func() { stop(); <-done }()

	// Other workers look at the same moment: the notice's key keeps it once.
	var looks sync.WaitGroup
	for range 4 {
		looks.Go(func() {
			if _, err := announceExpiring(ctx, pool, notice); err != nil {
				t.Errorf("announce: %v", err)
			}
		})
	}
	looks.Wait()
	expiring := func() []WebhookEvent {
		mu.Lock()
		defer mu.Unlock()
		var out []WebhookEvent
		for _, e := range delivered {
			if e.Type == "connection.expiring" {
				out = append(out, e)
			}
		}
		return out
	}
	settled := func(want int) []WebhookEvent {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			var pending int
			if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM tokenguard_webhook_outbox) +
				(SELECT count(*) FROM river_job WHERE kind = 'tokenguard_webhook' AND state <> 'completed')`).Scan(&pending); err != nil {
				t.Fatal(err)
			}
			if got := expiring(); pending == 0 && len(got) >= want || time.Now().After(deadline) {
				return got
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	settled(1)
	if n, err := announceExpiring(ctx, pool, notice); err != nil || n != 0 {
		t.Errorf("a later look announced %d (%v), want none", n, err)
	}
	got := settled(1)
	if len(got) != 1 || got[0].Connection != "soon" {
		t.Fatalf("connection.expiring events %+v, want one, for soon", got)
	}
	var data struct {
		RefreshExpiry time.Time `json:"refresh_expiry"`
		Status        string    `json:"status"`
	}
	if err := json.Unmarshal(got[0].Data, &data); err != nil || data.Status != "active" ||
		data.RefreshExpiry.Before(time.Now().Add(notice-2*time.Hour)) {
		t.Errorf("event data %s (%v)", got[0].Data, err)
	}

	// Control: a new grant is a new calendar, announced again.
	if _, err := pool.Exec(ctx, `UPDATE tokenguard_tokens SET granted_at = now(), version = version + 1
		WHERE connection_id = (SELECT id FROM tokenguard_connections WHERE name = 'soon')`); err != nil {
		t.Fatal(err)
	}
	if n, err := announceExpiring(ctx, pool, notice); err != nil || n != 1 {
		t.Errorf("after a new grant: announced %d (%v), want 1", n, err)
	}
	if got := settled(2); len(got) != 2 {
		t.Errorf("connection.expiring events after a new grant: %d, want 2", len(got))
	}
}
