package tokenguard_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/base64"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/lib/pq" // the "postgres" driver: not pgx
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"golang.org/x/oauth2"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/utils/tests"

	"github.com/tokenguard/tokenguard"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/internal/testdb"
	"github.com/tokenguard/tokenguard/internal/waitfor"
	"github.com/tokenguard/tokenguard/prom"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// world is a migrated database and a strict sandbox provider.
type world struct {
	url      string
	provider *sandbox.Provider
	srv      *httptest.Server
	oauth    *oauth2.Config
}

func newWorld(t *testing.T, opts sandbox.Options) *world {
	t.Helper()
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	p, err := sandbox.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p.Handler())
	t.Cleanup(srv.Close)
	oc := p.OAuth2Config(srv.URL)
	oc.Endpoint.AuthStyle = oauth2.AuthStyleInHeader
	return &world{url: testdb.NewEmpty(t), provider: p, srv: srv, oauth: oc}
}

// open is the application's own pool, as gorm.Open gives it.
func (w *world) open(t *testing.T, cfg *gorm.Config) *gorm.DB {
	t.Helper()
	if cfg == nil {
		cfg = &gorm.Config{}
	}
	db, err := gorm.Open(postgres.Open(w.url), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	return db
}

// grant runs the authorization-code flow at the sandbox.
func (w *world) grant(t *testing.T) *oauth2.Token {
	t.Helper()
	tok, err := sandbox.Grant(context.Background(), w.oauth)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// newTokens migrates db and builds Tokens on it.
func newTokens(t *testing.T, w *world, db *gorm.DB, opts ...tokenguard.Option) *tokenguard.Tokens {
	t.Helper()
	if err := tokenguard.Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	tg, err := tokenguard.New(db, w.oauth, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tg.Close(context.Background()) })
	return tg
}

// get calls the sandbox's protected resource with client.
func get(t *testing.T, client *http.Client, url string) int {
	t.Helper()
	resp, err := client.Get(url + "/resource")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func TestNewRejectsWhatCannotWork(t *testing.T) {
	w := newWorld(t, sandbox.Options{})
	db := w.open(t, nil)
	dummy, err := gorm.Open(tests.DummyDialector{}, &gorm.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tx := db.Begin()
	defer tx.Rollback()
	for name, c := range map[string]struct {
		db   *gorm.DB
		cfg  *oauth2.Config
		want string
	}{
		"not Postgres":     {dummy, w.oauth, `needs Postgres, and this *gorm.DB is "dummy"`},
		"a transaction":    {tx, w.oauth, "bound to a transaction"},
		"nil":              {nil, w.oauth, "nil *gorm.DB"},
		"no token URL":     {db, &oauth2.Config{ClientID: "x"}, "no Endpoint.TokenURL"},
		"before Migrate":   {db, w.oauth, "has Migrate run?"},
		"Migrate, not Pg":  {dummy, nil, `needs Postgres`},
		"Migrate, in a tx": {tx, nil, "bound to a transaction"},
	} {
		t.Run(name, func(t *testing.T) {
			var err error
			if c.cfg == nil {
				err = tokenguard.Migrate(context.Background(), c.db)
			} else {
				_, err = tokenguard.New(c.db, c.cfg)
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want one saying %q", err, c.want)
			}
		})
	}
}

// The whole public surface against a strict provider, on pgx and on lib/pq
// (where the lock transactions are GORM transactions), with PrepareStmt on
// the application's *gorm.DB and a pool of two connections: the refresh
// runs under the lock and the token rotates, nothing is reused.
func TestTokensEndToEnd(t *testing.T) {
	for _, driver := range []string{"pgx", "lib/pq"} {
		t.Run(driver, func(t *testing.T) {
			w := newWorld(t, sandbox.Options{AccessTokenLifespan: 2 * time.Second})
			cfg := &gorm.Config{PrepareStmt: true}
			var db *gorm.DB
			if driver == "pgx" {
				db = w.open(t, cfg)
			} else {
				sqlDB, err := sql.Open("postgres", w.url)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = sqlDB.Close() })
				if db, err = gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), cfg); err != nil {
					t.Fatal(err)
				}
			}
			sqlDB, _ := db.DB()
			sqlDB.SetMaxOpenConns(2)
			var logs bytes.Buffer
			var mu sync.Mutex
			reg := prometheus.NewRegistry()
			tg := newTokens(t, w, db,
				tokenguard.WithSkew(time.Second), tokenguard.WithLockWait(3*time.Second),
				prom.WithMetrics(reg), tokenguard.WithListenDSN(w.url),
				tokenguard.WithLogger(slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))))
			ctx := context.Background()
			if err := tg.Import(ctx, "acme", w.grant(t)); err != nil {
				t.Fatal(err)
			}
			first, err := tg.Token(ctx, "acme")
			if err != nil {
				t.Fatal(err)
			}
			if first.RefreshToken != "" {
				t.Fatal("Token handed out the refresh token")
			}
			if code := get(t, tg.Client(ctx, "acme"), w.srv.URL); code != http.StatusOK {
				t.Fatalf("resource answered %d", code)
			}
			// Until Run listens, every call reads the database, and says so.
			mu.Lock()
			said := strings.Contains(logs.String(), "bypassed until Run is running")
			mu.Unlock()
			if !said {
				t.Errorf("no log line about the bypassed cache:\n%s", logs.String())
			}
			if v := gauge(t, reg, "tokenguard_token_listener_connected"); v != 0 {
				t.Errorf("listener gauge %v before Run", v)
			}
			runCtx, stop := context.WithCancel(ctx)
			ran := make(chan error, 1)
			go func() { ran <- tg.Run(runCtx) }()
			waitfor.Until(t, 10*time.Second, "Run never connected", func() bool { return gauge(t, reg, "tokenguard_token_listener_connected") == 1 })

			// Past the skew the token is refreshed once, and the old access
			// token is revoked by the provider.
			time.Sleep(time.Until(first.Expiry) + 100*time.Millisecond)
			second, err := tg.Token(ctx, "acme")
			if err != nil {
				t.Fatal(err)
			}
			if second.AccessToken == first.AccessToken {
				t.Fatal("no refresh past the skew")
			}
			if code := get(t, tg.Client(ctx, "acme"), w.srv.URL); code != http.StatusOK {
				t.Fatalf("resource answered %d after the refresh", code)
			}
			src := oauth2.NewClient(ctx, tg.TokenSource(ctx, "acme"))
			if code := get(t, src, w.srv.URL); code != http.StatusOK {
				t.Fatalf("oauth2.NewClient: resource answered %d", code)
			}
			if st := w.provider.Stats(); st.Refreshes != 1 || st.RefreshReuse != 0 {
				t.Fatalf("provider: %d refreshes, %d reuses; want 1 and 0", st.Refreshes, st.RefreshReuse)
			}
			if _, err := tg.Token(ctx, "nobody"); !errors.Is(err, tokenguard.ErrNotFound) {
				t.Errorf("unknown connection: %v", err)
			}
			if err := tg.Import(ctx, "acme", &oauth2.Token{AccessToken: "a"}); !errors.Is(err, tokenguard.ErrInvalidToken) {
				t.Errorf("import without a refresh token: %v", err)
			}
			stop()
			if err := <-ran; err != nil {
				t.Fatalf("Run: %v", err)
			}
			if err := tg.Close(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := tg.Token(ctx, "acme"); !errors.Is(err, tokenguard.ErrClosed) {
				t.Errorf("after Close: %v", err)
			}
		})
	}
}

// A caller that gives up does not stop a refresh the provider is
// answering; Close waits for it, so the rotated token is stored before the
// pool closes. Without the wait the next refresh would present the dead
// refresh token.
func TestCloseWaitsForTheRefreshInFlight(t *testing.T) {
	held := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	w := newWorld(t, sandbox.Options{AccessTokenLifespan: time.Second, RefreshFault: func() sandbox.Fault {
		once.Do(func() { close(held); <-release })
		return sandbox.FaultNone
	}})
	db := w.open(t, nil)
	tg := newTokens(t, w, db, tokenguard.WithSkew(500*time.Millisecond), tokenguard.WithLockWait(6*time.Second),
		tokenguard.WithRefreshTimeout(4*time.Second))
	ctx := context.Background()
	if err := tg.Import(ctx, "acme", w.grant(t)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(600 * time.Millisecond) // due
	callCtx, giveUp := context.WithCancel(ctx)
	called := make(chan error, 1)
	go func() { _, err := tg.Token(callCtx, "acme"); called <- err }()
	<-held
	giveUp()
	if err := <-called; !errors.Is(err, context.Canceled) {
		t.Fatalf("caller: %v", err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := tg.Close(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close with the refresh held: %v, want it to wait", err)
	}
	closed := make(chan error, 1)
	go func() { closed <- tg.Close(ctx) }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) before the refresh ended", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	var version int64
	if err := db.Raw("SELECT version FROM tokenguard_tokens").Scan(&version).Error; err != nil || version != 2 {
		t.Fatalf("stored version %d (%v): the rotated token was not stored", version, err)
	}
	// The stored refresh token is the rotated one: it refreshes, no reuse.
	tg2 := newTokens(t, w, db, tokenguard.WithSkew(500*time.Millisecond))
	time.Sleep(time.Second)
	if _, err := tg2.Token(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	if st := w.provider.Stats(); st.Refreshes != 2 || st.RefreshReuse != 0 {
		t.Fatalf("provider: %d refreshes, %d reuses; want 2 and 0", st.Refreshes, st.RefreshReuse)
	}
}

// gauge and counter read the first series of a metric in reg.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	return metric(t, reg, name).GetGauge().GetValue()
}

func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	return metric(t, reg, name).GetCounter().GetValue()
}

func metric(t *testing.T, reg *prometheus.Registry, name string) *dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0]
		}
	}
	t.Fatalf("no metric %s", name)
	return nil
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// tokenguard's tables go to the current schema of the *gorm.DB it is given:
// a pool whose search_path names a schema of their own keeps them apart
// from the application's tables (and its schema_migrations), Run included.
func TestTablesInASchemaOfTheirOwn(t *testing.T) {
	w := newWorld(t, sandbox.Options{})
	app := w.open(t, nil)
	ctx := context.Background()
	if err := app.Exec("CREATE SCHEMA tokenguard").Error; err != nil {
		t.Fatal(err)
	}
	sep := "?"
	if strings.Contains(w.url, "?") {
		sep = "&"
	}
	db, err := gorm.Open(postgres.Open(w.url+sep+"search_path=tokenguard"), &gorm.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	reg := prometheus.NewRegistry()
	tg := newTokens(t, w, db, prom.WithMetrics(reg))
	if err := tg.Import(ctx, "acme", w.grant(t)); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = tg.Run(runCtx) }()
	waitfor.Until(t, 10*time.Second, "Run never connected", func() bool { return gauge(t, reg, "tokenguard_token_listener_connected") == 1 })
	if code := get(t, tg.Client(ctx, "acme"), w.srv.URL); code != http.StatusOK {
		t.Fatalf("resource answered %d", code)
	}
	var tables []string
	if err := app.Raw(`SELECT table_schema || '.' || table_name FROM information_schema.tables
		WHERE table_schema IN ('public', 'tokenguard') ORDER BY 1`).Scan(&tables).Error; err != nil {
		t.Fatal(err)
	}
	got := " " + strings.Join(tables, " ") + " "
	for _, want := range []string{"tokenguard.tokenguard_connections", "tokenguard.tokenguard_tokens", "tokenguard.tokenguard_schema_migrations"} {
		if !strings.Contains(got, " "+want+" ") {
			t.Errorf("no %s among %s", want, got)
		}
	}
	if strings.Contains(got, " public.") {
		t.Errorf("tables in public: %s", got)
	}
}

// A search_path naming a schema that does not exist is ErrSchemaNotFound
// naming it, from Migrate and from New: tokenguard's tables never fall
// through to the next schema of the path (public here), and New never
// reads the tables of another schema.
func TestSearchPathNamingAMissingSchema(t *testing.T) {
	w := newWorld(t, sandbox.Options{})
	app := w.open(t, nil)
	ctx := context.Background()
	if err := tokenguard.Migrate(ctx, app); err != nil { // tokenguard's tables in public
		t.Fatal(err)
	}
	sep := "?"
	if strings.Contains(w.url, "?") {
		sep = "&"
	}
	db, err := gorm.Open(postgres.Open(w.url+sep+"search_path=tenant_7,public"), &gorm.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	err = tokenguard.Migrate(ctx, db)
	if !errors.Is(err, tokenguard.ErrSchemaNotFound) || !strings.Contains(err.Error(), `"tenant_7"`) {
		t.Errorf("Migrate: %v, want ErrSchemaNotFound naming tenant_7", err)
	}
	tg, err := tokenguard.New(db, w.oauth)
	if !errors.Is(err, tokenguard.ErrSchemaNotFound) || !strings.Contains(err.Error(), `"tenant_7"`) || tg != nil {
		t.Errorf("New: %v, want ErrSchemaNotFound naming tenant_7", err)
	}
	// The control: with the schema created the same pool works.
	if err := app.Exec("CREATE SCHEMA tenant_7").Error; err != nil {
		t.Fatal(err)
	}
	tg = newTokens(t, w, db)
	if err := tg.Import(ctx, "acme", w.grant(t)); err != nil {
		t.Fatal(err)
	}
	var n int64
	if err := app.Raw("SELECT count(*) FROM tenant_7.tokenguard_tokens").Scan(&n).Error; err != nil || n != 1 {
		t.Fatalf("tokens in tenant_7: %d, %v", n, err)
	}
}

// The application's GORM callbacks and plugins (a query logger, a tracer)
// never see tokenguard's statements, so never a token in their bound
// values.
func TestApplicationCallbacksSeeNoToken(t *testing.T) {
	w := newWorld(t, sandbox.Options{AccessTokenLifespan: time.Second})
	db := w.open(t, nil)
	var mu sync.Mutex
	var seen []string
	record := func(tx *gorm.DB) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, tx.Statement.SQL.String())
		for _, v := range tx.Statement.Vars {
			if s, ok := v.(string); ok {
				seen = append(seen, s)
			}
		}
	}
	cb := db.Callback()
	for _, err := range []error{
		cb.Query().Before("gorm:query").Register("app:record", record),
		cb.Raw().Before("gorm:raw").Register("app:record", record),
		cb.Row().Before("gorm:row").Register("app:record", record),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	tg := newTokens(t, w, db, tokenguard.WithSkew(500*time.Millisecond))
	ctx := context.Background()
	grant := w.grant(t)
	if err := tg.Import(ctx, "acme", grant); err != nil {
		t.Fatal(err)
	}
	time.Sleep(600 * time.Millisecond) // due: the next call refreshes
	tok, err := tg.Token(ctx, "acme")
	if err != nil || tok.AccessToken == grant.AccessToken {
		t.Fatalf("no refresh: %v", err)
	}
	if err := db.Exec("SELECT 1").Error; err != nil { // the callbacks do run
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	all := strings.Join(seen, "\n")
	if !strings.Contains(all, "SELECT 1") {
		t.Fatalf("the application's callbacks never ran:\n%s", all)
	}
	for _, secret := range []string{grant.AccessToken, grant.RefreshToken, tok.AccessToken} {
		if strings.Contains(all, secret) {
			t.Fatal("an application callback saw a token")
		}
	}
	if strings.Contains(all, "tokens") {
		t.Fatalf("an application callback saw tokenguard's statements:\n%s", all)
	}
}

// With encryption required, a plaintext row stops New (naming the
// connection) until it is sealed; once sealed, the same settings start.
func TestEncryptionRequiredRefusesPlaintextRows(t *testing.T) {
	w := newWorld(t, sandbox.Options{})
	db := w.open(t, nil)
	plain := newTokens(t, w, db)
	if err := plain.Import(context.Background(), "acme", w.grant(t)); err != nil {
		t.Fatal(err)
	}
	keys := "k1=" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32)) + "*"
	_, err := tokenguard.New(db, w.oauth, tokenguard.WithEncryptionKeys(keys), tokenguard.WithEncryptionRequired())
	if !errors.Is(err, tokenguard.ErrUndecryptable) || !strings.Contains(err.Error(), "acme") || !strings.Contains(err.Error(), "TOKEN_ENCRYPTION_REQUIRED") {
		t.Fatalf("New with a plaintext row = %v; want ErrUndecryptable naming acme and the setting", err)
	}
	if _, err := tokenguard.New(db, w.oauth, tokenguard.WithEncryptionRequired()); err == nil {
		t.Fatal("WithEncryptionRequired without keys accepted")
	}
	// Imported again with the keys, the row is sealed and New starts.
	sealed := newTokens(t, w, db, tokenguard.WithEncryptionKeys(keys))
	if err := sealed.Import(context.Background(), "acme", w.grant(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := tokenguard.New(db, w.oauth, tokenguard.WithEncryptionKeys(keys), tokenguard.WithEncryptionRequired()); err != nil {
		t.Fatalf("New with every row sealed: %v", err)
	}
}
