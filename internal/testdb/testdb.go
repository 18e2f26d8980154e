// Package testdb gives tests a fresh, migrated Postgres database of their own.
//
// The server is found as the demo finds its own (internal/pgserver):
// TEST_DATABASE_URL, else a dockertest container, else a Postgres on
// 127.0.0.1:5432, else a throw-away cluster made with the local initdb.
// TESTDB_SKIP skips steps (TESTDB_SKIP=env,docker,local forces the
// throw-away cluster). With none left, tests fail saying what to install.
// Every call to New creates a new database and drops it when the test ends,
// so runs and packages never see each other's rows.
package testdb

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/internal/pgserver"
	"github.com/tokenguard/tokenguard/migrations"
)

// EnvURL names the variable that points tests at an existing server. Its
// database is only used to create and drop the per-test databases.
const EnvURL = "TEST_DATABASE_URL"

// EnvSkip names the variable listing the steps not to try: env, docker,
// local, initdb.
const EnvSkip = "TESTDB_SKIP"

var (
	once      sync.Once
	server    *pgserver.Server
	serverErr error
)

// Main runs a package's tests and stops the server, if they started one.
// Use it as the body of TestMain. A package without it leaves a container
// to expire and a throw-away cluster to its supervisor, which removes it
// when the test binary exits. m is a *testing.M, or a wrapper of its Run
// that sets up and tears down more around it.
func Main(m interface{ Run() int }) {
	code := m.Run()
	runAtExit()
	server.Close()
	os.Exit(code)
}

// URL returns the admin URL of the test server, starting one if needed.
func URL(tb testing.TB) string {
	tb.Helper()
	once.Do(func() { server, serverErr = find() })
	if serverErr != nil {
		// A fresh clone with no Postgres skips the suites that need one,
		// saying so once per package; CI fails instead.
		if os.Getenv("CI") != "" {
			tb.Fatalf("no test database: %v", serverErr)
		}
		if skipSaid.CompareAndSwap(false, true) {
			tb.Skipf("skipped: needs Postgres (%s, Postgres on 127.0.0.1:5432 with user postgres and trust, or initdb: apt-get install postgresql): %s", EnvURL, OneLine(serverErr))
		}
		tb.SkipNow()
	}
	return server.URL
}

// ServerURL is URL for a TestMain, which has no testing.TB: the admin URL
// of the test server, or why there is none.
func ServerURL() (string, error) {
	once.Do(func() { server, serverErr = find() })
	if serverErr != nil {
		return "", serverErr
	}
	return server.URL, nil
}

// OneLine is err's message on one line (drivers list every address they
// tried on lines of their own).
func OneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// skipSaid is set once a test said why the suite is skipped.
var skipSaid atomic.Bool

func find() (*pgserver.Server, error) {
	skip, err := pgserver.ParseSkip(os.Getenv(EnvSkip))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", EnvSkip, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	return pgserver.Find(ctx, pgserver.Options{URLVar: EnvURL, Skip: skip, MinConnections: suiteConnections,
		Note: func(s string) { fmt.Fprintln(os.Stderr, "testdb: "+s) }})
}

// suiteConnections is what the test packages, run side by side by go
// test, may hold at once on one server (the end-to-end tests' processes,
// the peer designs' storms). A local server that allows fewer, as a stock
// Postgres does, is passed over for a throw-away cluster of each package's
// own.
const suiteConnections = 197

// New creates an empty database, applies the migrations and returns its URL.
// The database is dropped when tb ends.
func New(tb testing.TB) string {
	tb.Helper()
	return NewOn(tb, URL(tb))
}

// NewEmpty creates a database without applying the migrations.
func NewEmpty(tb testing.TB) string {
	tb.Helper()
	return newEmptyOn(tb, URL(tb))
}

// NewOn is New on the server at admin (an admin URL, such as a throw-away
// cluster's) rather than the test server.
func NewOn(tb testing.TB, admin string) string {
	tb.Helper()
	u := newEmptyOn(tb, admin)
	if err := migrations.Up(u); err != nil {
		tb.Fatalf("migrate test database: %v", err)
	}
	return u
}

func newEmptyOn(tb testing.TB, admin string) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u, drop, err := pgserver.CreateDatabase(ctx, admin, "tg_test")
	if err != nil {
		tb.Fatalf("create test database: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := drop(ctx); err != nil {
			tb.Errorf("%v", err)
		}
	})
	return u
}
