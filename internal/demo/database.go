package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ory/dockertest/v3"
	"github.com/ory/dockertest/v3/docker"
)

// LocalURL is the server tried last: a Postgres on this machine.
const LocalURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// Server is a Postgres server the demo may create a database on.
type Server struct {
	AdminURL string
	Source   string // "DATABASE_URL", "dockertest" or "local"
	close    func()
}

// Close stops the server if the demo started it.
func (s *Server) Close() {
	if s.close != nil {
		s.close()
	}
}

// FindServer picks a server: DATABASE_URL if set, else a Postgres started
// with dockertest, else the local server at LocalURL. notes receives one
// line per fallback.
func FindServer(ctx context.Context, notes func(string)) (*Server, error) {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		if err := ping(ctx, u, 5*time.Second); err != nil {
			return nil, fmt.Errorf("DATABASE_URL is set but does not answer: %w", err)
		}
		return &Server{AdminURL: u, Source: "DATABASE_URL"}, nil
	}
	s, err := dockerServer(ctx)
	if err == nil {
		return s, nil
	}
	notes("no Docker for dockertest (" + short(err) + "); trying Postgres on 127.0.0.1:5432")
	if err := ping(ctx, LocalURL, 3*time.Second); err != nil {
		return nil, errors.New("no Postgres: set DATABASE_URL to a server the demo may create a database on, " +
			"start Docker (the demo then runs postgres:16-alpine with dockertest), or run Postgres on 127.0.0.1:5432 " +
			"accepting user postgres without a password (" + short(err) + ")")
	}
	return &Server{AdminURL: LocalURL, Source: "local"}, nil
}

func dockerServer(ctx context.Context) (*Server, error) {
	pool, err := dockertest.NewPool("")
	if err != nil {
		return nil, err
	}
	if err := pool.Client.Ping(); err != nil {
		return nil, err
	}
	res, err := pool.RunWithOptions(&dockertest.RunOptions{
		Repository: "postgres", Tag: "16-alpine",
		Env: []string{"POSTGRES_PASSWORD=postgres", "POSTGRES_DB=postgres"},
	}, func(hc *docker.HostConfig) {
		hc.AutoRemove = true
		hc.RestartPolicy = docker.RestartPolicy{Name: "no"}
	})
	if err != nil {
		return nil, err
	}
	_ = res.Expire(900) // even a killed demo leaves no container behind for long
	u := fmt.Sprintf("postgres://postgres:postgres@%s/postgres?sslmode=disable", res.GetHostPort("5432/tcp"))
	pool.MaxWait = 60 * time.Second
	if err := pool.Retry(func() error { return ping(ctx, u, 2*time.Second) }); err != nil {
		_ = pool.Purge(res)
		return nil, err
	}
	return &Server{AdminURL: u, Source: "dockertest", close: func() { _ = pool.Purge(res) }}, nil
}

// CreateDatabase creates a fresh database named prefix_<random> and returns
// its URL and a function that drops it.
func CreateDatabase(ctx context.Context, adminURL, prefix string) (string, func() error, error) {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	name := prefix + "_" + hex.EncodeToString(b)
	if err := adminExec(ctx, adminURL, "CREATE DATABASE "+name); err != nil {
		return "", nil, fmt.Errorf("create database %s: %w", name, err)
	}
	u, err := url.Parse(adminURL)
	if err != nil {
		return "", nil, err
	}
	u.Path = "/" + name
	drop := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// FORCE ends the sessions of apps that did not stop.
		return adminExec(ctx, adminURL, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	}
	return u.String(), drop, nil
}

func adminExec(ctx context.Context, adminURL, sql string) error {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, sql)
	return err
}

func ping(ctx context.Context, u string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return conn.Ping(ctx)
}

func short(err error) string {
	s := err.Error()
	if len(s) > 120 {
		s = s[:120] + "…"
	}
	return s
}
