package tokenguard_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenguard/tokenguard"
	"github.com/tokenguard/tokenguard/internal/pgserver"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/waitfor"
	"github.com/tokenguard/tokenguard/prom"
)

func TestWithSyncCommitIsValidated(t *testing.T) {
	w := newWorld(t, sandbox.Options{})
	db := w.open(t, nil)
	if err := tokenguard.Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	_, err := tokenguard.New(db, w.oauth, tokenguard.WithSyncCommit("always"))
	if !errors.Is(err, tokenguard.ErrInvalidSyncCommit) || !strings.Contains(err.Error(), "always") {
		t.Fatalf("New with synchronous_commit \"always\" = %v, want ErrInvalidSyncCommit naming it", err)
	}
	for _, level := range []string{"off", "local", "remote_write", "on", "remote_apply"} {
		newTokens(t, w, db, tokenguard.WithSyncCommit(level))
	}
}

// A database that goes back in time (here: the token row restored from a
// copy taken before the last refresh, as a restore from backup or a
// failover to a standby that missed the commit would leave it) holds a
// refresh token the provider has already rotated. The process that stored
// the rotation writes it again: nothing is presented twice. When that
// process is gone, one that knew the newer version says so: an ERROR, the
// metric, the webhook event.
func TestRolledBackTokenIsWrittenBackOrReported(t *testing.T) {
	w := newWorld(t, sandbox.Options{AccessTokenLifespan: 2 * time.Second})
	db := w.open(t, nil)
	var logs bytes.Buffer
	var mu sync.Mutex
	reg := prometheus.NewRegistry()
	tg := newTokens(t, w, db, tokenguard.WithSkew(time.Second), prom.WithMetrics(reg),
		tokenguard.WithLogger(slog.New(slog.NewJSONHandler(lockedWriter{&mu, &logs}, nil))))
	ctx := context.Background()
	logged := func(s string) bool { mu.Lock(); defer mu.Unlock(); return strings.Contains(logs.String(), s) }

	// At start: the server has no standby, and says what that can lose.
	if !logged("no standby: a failover or a restore from backup can lose token writes") {
		t.Errorf("no line on what a failover can lose:\n%s", logs.String())
	}
	if v := gauge(t, reg, "tokenguard_replication_sync"); v != 0 {
		t.Errorf("tokenguard_replication_sync = %v without a standby", v)
	}

	if err := tg.Import(ctx, "acme", w.grant(t)); err != nil {
		t.Fatal(err)
	}
	backup := func() {
		if err := db.Exec("DROP TABLE IF EXISTS tokens_backup; CREATE TABLE tokens_backup AS SELECT * FROM tokenguard_tokens").Error; err != nil {
			t.Fatal(err)
		}
	}
	restore := func() {
		if err := db.Exec(`UPDATE tokenguard_tokens t SET access_token = b.access_token, refresh_token = b.refresh_token, expiry = b.expiry,
obtained_at = b.obtained_at, version = b.version FROM tokens_backup b WHERE b.connection_id = t.connection_id`).Error; err != nil {
			t.Fatal(err)
		}
	}
	version := func() int64 {
		var v int64
		if err := db.Raw("SELECT version FROM tokenguard_tokens").Scan(&v).Error; err != nil {
			t.Fatal(err)
		}
		return v
	}
	backup()
	time.Sleep(1100 * time.Millisecond) // due: within the skew of its expiry
	if _, err := tg.Token(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	if v := version(); v != 2 {
		t.Fatalf("version after the refresh = %d, want 2", v)
	}
	// The control: nothing went back, nothing is reported.
	if logged("went back to an older version") || counter(t, reg, "tokenguard_token_version_regressions_total") != 0 {
		t.Fatal("a regression reported while the database kept every write")
	}

	// The process that stored version 2 writes it again.
	restore()
	waitfor.Until(t, 5*time.Second, "the lost rotation was never written back", func() bool { return logged("is stored again") })
	time.Sleep(1100 * time.Millisecond)
	if _, err := tg.Token(ctx, "acme"); err != nil {
		t.Fatalf("Token after the rollback was written back: %v", err)
	}
	if v, st := version(), w.provider.Stats(); v != 3 || st.RefreshReuse != 0 {
		t.Fatalf("after the write-back and a refresh: version %d, provider reuse %d; want 3, 0", v, st.RefreshReuse)
	}

	// Another process stores version 4 and is gone with it.
	backup()
	otherDB := w.open(t, nil)
	other := newTokens(t, w, otherDB, tokenguard.WithSkew(time.Second))
	time.Sleep(1100 * time.Millisecond)
	if _, err := other.Token(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	if _, err := tg.Token(ctx, "acme"); err != nil || version() != 4 {
		t.Fatalf("Token after the other process refreshed: %v at version %d, want version 4", err, version())
	}
	if err := other.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if sqlDB, err := otherDB.DB(); err != nil || sqlDB.Close() != nil {
		t.Fatal("close the other process's pool")
	}
	restore()
	time.Sleep(1100 * time.Millisecond)
	if _, err := tg.Token(ctx, "acme"); !errors.Is(err, tokenguard.ErrNeedsReauth) {
		t.Fatalf("Token after the rollback = %v, want ErrNeedsReauth (the restored refresh token was spent)", err)
	}
	if st := w.provider.Stats(); st.RefreshReuse != 1 {
		t.Errorf("provider reuse = %d, want 1", st.RefreshReuse)
	}
	mu.Lock()
	var found bool
	for _, l := range strings.Split(logs.String(), "\n") {
		var rec struct {
			Level, Msg, Connection string
			Known                  int64 `json:"known_version"`
			Stored                 int64 `json:"stored_version"`
		}
		if json.Unmarshal([]byte(l), &rec) == nil && strings.Contains(rec.Msg, "went back to an older version") {
			found = rec.Level == "ERROR" && rec.Connection == "acme" && rec.Known == 4 && rec.Stored == 3
		}
	}
	mu.Unlock()
	if !found {
		t.Errorf("no ERROR line for acme, known 4, stored 3:\n%s", logs.String())
	}
	if v := counter(t, reg, "tokenguard_token_version_regressions_total"); v != 1 {
		t.Errorf("tokenguard_token_version_regressions_total = %v, want 1", v)
	}
	var events []struct {
		Type string
		Data string
	}
	if err := db.Raw("SELECT type, data::text AS data FROM tokenguard_webhook_outbox WHERE type = 'connection.rolled_back'").Scan(&events).Error; err != nil {
		t.Fatal(err)
	}
	if len(events) != 1 || !strings.Contains(events[0].Data, `"known_version": 4`) || !strings.Contains(events[0].Data, `"stored_version": 3`) {
		t.Errorf("connection.rolled_back events = %+v, want one, known 4, stored 3", events)
	}
}

// At each reconnection of Run's listener (where a failover shows) the
// replication state is read again: a standby made synchronous meanwhile
// turns tokenguard_replication_sync to 1 and is said in one line.
func TestReplicationIsReadAgainWhenTheListenerReconnects(t *testing.T) {
	if testing.Short() {
		t.Skip("starts postgres")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pair, err := pgserver.StartPair(ctx, false)
	if err != nil {
		t.Skipf("no throw-away primary and standby: %v", err)
	}
	t.Cleanup(pair.Close)
	u, _, err := pgserver.CreateDatabase(ctx, pair.PrimaryURL(), "tokenguard")
	if err != nil {
		t.Fatal(err)
	}
	p, err := sandbox.New(sandbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	w := &world{url: u, provider: p, oauth: p.OAuth2Config("http://127.0.0.1:1")}
	db := w.open(t, nil)
	var logs bytes.Buffer
	var mu sync.Mutex
	reg := prometheus.NewRegistry()
	tg := newTokens(t, w, db, prom.WithMetrics(reg), tokenguard.WithListenDSN(u),
		tokenguard.WithLogger(slog.New(slog.NewJSONHandler(lockedWriter{&mu, &logs}, nil))))
	logged := func(s string) bool { mu.Lock(); defer mu.Unlock(); return strings.Contains(logs.String(), s) }
	if !logged("standbys are asynchronous") || gauge(t, reg, "tokenguard_replication_sync") != 0 {
		t.Fatalf("at start with an asynchronous standby: gauge %v, logs:\n%s", gauge(t, reg, "tokenguard_replication_sync"), logs.String())
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = tg.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	waitfor.Until(t, 10*time.Second, "Run never connected", func() bool { return gauge(t, reg, "tokenguard_token_listener_connected") == 1 })

	admin, err := pgx.Connect(ctx, pair.PrimaryURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	for _, q := range []string{"ALTER SYSTEM SET synchronous_standby_names = '*'", "SELECT pg_reload_conf()"} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	waitfor.Until(t, 10*time.Second,

		"the standby never became synchronous", func() bool {
			var state string
			_ = admin.QueryRow(ctx, "SELECT coalesce(max(sync_state), '') FROM pg_stat_replication").Scan(&state)
			return state == "sync"
		})

	if gauge(t, reg, "tokenguard_replication_sync") != 0 {
		t.Fatal("read again before the listener reconnected")
	}
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'tokenguard-listener'"); err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, 10*time.Second, "not read again at the reconnection", func() bool { return gauge(t, reg, "tokenguard_replication_sync") == 1 })
	if !logged("a failover to a synchronous standby loses no committed token write") {
		t.Errorf("no line on the change:\n%s", logs.String())
	}
}
