// Package testdb gives tests a fresh, migrated Postgres database of their own.
//
// The server comes from TEST_DATABASE_URL when it is set (CI and this
// machine), otherwise from a throw-away container started with dockertest
// (a laptop with Docker). With neither, tests fail with a message saying
// how to get one. Every call to New creates a new database and drops it
// when the test ends, so runs and packages never see each other's rows.
package testdb

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // "pgx" driver for the admin connection
	"github.com/ory/dockertest/v3"
	"github.com/ory/dockertest/v3/docker"

	"github.com/tokenguard/tokenguard/migrations"
)

// EnvURL names the variable that points tests at an existing server. Its
// database is only used to create and drop the per-test databases.
const EnvURL = "TEST_DATABASE_URL"

const howTo = "no test database: set " + EnvURL +
	" (for example postgres://postgres@127.0.0.1:5432/test?sslmode=disable) or start a Docker engine for dockertest"

var (
	once      sync.Once
	serverURL string
	serverErr error
	container *dockertest.Resource
	pool      *dockertest.Pool
)

// Main runs a package's tests and removes the container, if one was started.
// Use it as the body of TestMain.
func Main(m *testing.M) {
	code := m.Run()
	if container != nil {
		_ = pool.Purge(container)
	}
	os.Exit(code)
}

// URL returns the admin URL of the test server, starting one if needed.
func URL(tb testing.TB) string {
	tb.Helper()
	once.Do(func() { serverURL, serverErr = server() })
	if serverErr != nil {
		tb.Fatalf("%s: %v", howTo, serverErr)
	}
	return serverURL
}

// New creates an empty database, applies the migrations and returns its URL.
// The database is dropped when tb ends.
func New(tb testing.TB) string {
	tb.Helper()
	u := NewEmpty(tb)
	if err := migrations.Up(u); err != nil {
		tb.Fatalf("migrate test database: %v", err)
	}
	return u
}

// NewEmpty creates a database without applying the migrations.
func NewEmpty(tb testing.TB) string {
	tb.Helper()
	admin := URL(tb)
	db, err := sql.Open("pgx", admin)
	if err != nil {
		tb.Fatalf("open test server: %v", err)
	}
	defer db.Close()
	name := "tg_test_" + randomSuffix()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		tb.Fatalf("create test database: %v", err)
	}
	tb.Cleanup(func() { drop(tb, admin, name) })
	return withDatabase(admin, name)
}

func drop(tb testing.TB, admin, name string) {
	db, err := sql.Open("pgx", admin)
	if err != nil {
		tb.Errorf("open test server: %v", err)
		return
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// FORCE ends sessions a failed test left behind.
	if _, err := db.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
		tb.Errorf("drop test database %s: %v", name, err)
	}
}

func server() (string, error) {
	if u := os.Getenv(EnvURL); u != "" {
		return u, ping(u, 5*time.Second)
	}
	p, err := dockertest.NewPool("")
	if err != nil {
		return "", fmt.Errorf("dockertest: %w", err)
	}
	if err := p.Client.Ping(); err != nil {
		return "", fmt.Errorf("dockertest: no Docker engine: %w", err)
	}
	res, err := p.RunWithOptions(&dockertest.RunOptions{
		Repository: "postgres",
		Tag:        "16-alpine",
		Env:        []string{"POSTGRES_PASSWORD=postgres", "POSTGRES_DB=test"},
	}, func(hc *docker.HostConfig) {
		hc.AutoRemove = true
		hc.RestartPolicy = docker.RestartPolicy{Name: "no"}
	})
	if err != nil {
		return "", fmt.Errorf("dockertest: start postgres: %w", err)
	}
	_ = res.Expire(600) // a crashed test run must not leave it running for ever
	pool, container = p, res
	u := fmt.Sprintf("postgres://postgres:postgres@%s/test?sslmode=disable", res.GetHostPort("5432/tcp"))
	p.MaxWait = 60 * time.Second
	if err := p.Retry(func() error { return ping(u, 2*time.Second) }); err != nil {
		return "", fmt.Errorf("dockertest: postgres did not come up: %w", err)
	}
	return u, nil
}

func ping(u string, timeout time.Duration) error {
	db, err := sql.Open("pgx", u)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return db.PingContext(ctx)
}

func withDatabase(admin, name string) string {
	u, err := url.Parse(admin)
	if err != nil {
		// Key=value connection strings: a later dbname wins.
		return admin + " dbname=" + name
	}
	u.Path = "/" + name
	return u.String()
}

func randomSuffix() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
