package pgserver

import (
	"context"
	"fmt"
	"time"

	"github.com/ory/dockertest/v3"
	"github.com/ory/dockertest/v3/docker"
)

func dockerServer(ctx context.Context) (*Server, error) {
	pool, err := dockertest.NewPool("")
	if err != nil {
		return nil, err
	}
	if err := pool.Client.Ping(); err != nil {
		return nil, fmt.Errorf("no Docker engine: %w", err)
	}
	res, err := pool.RunWithOptions(&dockertest.RunOptions{
		Repository: "postgres", Tag: "16-alpine",
		Env: []string{"POSTGRES_PASSWORD=postgres", "POSTGRES_DB=postgres"},
	}, func(hc *docker.HostConfig) {
		hc.AutoRemove = true
		hc.RestartPolicy = docker.RestartPolicy{Name: "no"}
	})
	if err != nil {
		return nil, fmt.Errorf("start postgres container: %w", err)
	}
	_ = res.Expire(900) // a killed owner leaves no container behind for long
	u := fmt.Sprintf("postgres://postgres:postgres@%s/postgres?sslmode=disable", res.GetHostPort("5432/tcp"))
	pool.MaxWait = 60 * time.Second
	if err := pool.Retry(func() error { return Ping(ctx, u, 2*time.Second) }); err != nil {
		_ = pool.Purge(res)
		return nil, fmt.Errorf("postgres container did not come up: %w", err)
	}
	return &Server{URL: u, Source: "dockertest", close: func() { _ = pool.Purge(res) }}, nil
}
