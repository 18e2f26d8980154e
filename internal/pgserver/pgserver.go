// Package pgserver finds a Postgres server that tests and the demo may
// create databases on, in one order shared by both:
//
//  1. env: the URL in a variable (TEST_DATABASE_URL for tests, DATABASE_URL
//     for the demo);
//  2. docker: a postgres:16-alpine container started with dockertest;
//  3. local: a Postgres on 127.0.0.1:5432 that lets user postgres in
//     without a password;
//  4. initdb: a throw-away cluster made with this machine's initdb and run
//     from a temporary directory, removed when its owner ends, however it
//     ends.
//
// Only when every step fails does Find fail, saying what to install.
package pgserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The steps of Find, in order; Options.Skip names them.
const (
	StepEnv    = "env"
	StepDocker = "docker"
	StepLocal  = "local"
	StepInitdb = "initdb"
)

var steps = []string{StepEnv, StepDocker, StepLocal, StepInitdb}

// LocalURL is the server of the local step.
const LocalURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// Options says where Find looks.
type Options struct {
	URLVar string       // variable of the env step, e.g. "TEST_DATABASE_URL"
	Skip   []string     // steps not to try (see ParseSkip)
	Note   func(string) // told one line per step that did not work; may be nil
	// MinConnections: the local server is taken only if it allows this
	// many client connections (a stock Postgres allows 97); 0 takes any.
	MinConnections int
}

// Server is a Postgres server on which databases may be created.
type Server struct {
	// URL is the admin URL: its database is only used to create and drop
	// others.
	URL string
	// Source says which step found it: the variable's name, "dockertest",
	// "local" or "initdb".
	Source  string
	close   func()
	restart func(context.Context) (time.Duration, error)
}

// StartCluster makes and starts a throw-away cluster (the initdb step of
// Find) in a new directory under base (the temporary directory when
// empty), whatever else this machine offers: its owner may restart it.
func StartCluster(ctx context.Context, base string) (*Server, error) {
	return startCluster(ctx, base)
}

// Restart stops the server with a fast shutdown (sessions are ended) and
// starts it again on the same data, directory and port; it returns once
// the server answers again, with how long it was away. Only servers from
// StartCluster (or Find's initdb step) can be restarted.
func (s *Server) Restart(ctx context.Context) (time.Duration, error) {
	if s == nil || s.restart == nil {
		return 0, errors.New("pgserver: only a throw-away cluster can be restarted")
	}
	return s.restart(ctx)
}

// Close stops the server if Find started it. It is safe on a nil Server.
func (s *Server) Close() {
	if s != nil && s.close != nil {
		s.close()
	}
}

// ParseSkip reads a comma-separated list of step names, such as
// "env,docker,local".
func ParseSkip(s string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		known := false
		for _, st := range steps {
			known = known || f == st
		}
		if !known {
			return nil, fmt.Errorf("unknown step %q (steps: %s)", f, strings.Join(steps, ", "))
		}
		out = append(out, f)
	}
	return out, nil
}

// Find walks the steps in order and returns the first server that answers.
// A URL variable that is set but does not answer is an error, not a reason
// to look further: it names the server the user asked for.
func Find(ctx context.Context, o Options) (*Server, error) {
	note := o.Note
	if note == nil {
		note = func(string) {}
	}
	skipped := map[string]bool{}
	for _, s := range o.Skip {
		skipped[s] = true
	}
	var reasons []string
	fail := func(step string, err error) {
		reasons = append(reasons, step+": "+short(err))
		note(step + " did not work: " + short(err))
	}

	if skipped[StepEnv] {
		reasons = append(reasons, StepEnv+": skipped")
	} else if u := os.Getenv(o.URLVar); u != "" {
		if err := Ping(ctx, u, 5*time.Second); err != nil {
			return nil, fmt.Errorf("%s is set but does not answer: %w", o.URLVar, err)
		}
		return &Server{URL: u, Source: o.URLVar}, nil
	} else {
		reasons = append(reasons, StepEnv+": "+o.URLVar+" is not set")
	}

	if skipped[StepDocker] {
		reasons = append(reasons, StepDocker+": skipped")
	} else if s, err := dockerServer(ctx); err == nil {
		return s, nil
	} else {
		fail(StepDocker, err)
	}

	if skipped[StepLocal] {
		reasons = append(reasons, StepLocal+": skipped")
	} else if err := Ping(ctx, LocalURL, 3*time.Second); err != nil {
		fail(StepLocal+" (127.0.0.1:5432)", err)
	} else if err := allows(ctx, LocalURL, o.MinConnections); err != nil {
		fail(StepLocal+" (127.0.0.1:5432)", err)
	} else {
		return &Server{URL: LocalURL, Source: "local"}, nil
	}

	if skipped[StepInitdb] {
		reasons = append(reasons, StepInitdb+": skipped")
	} else if s, err := startCluster(ctx, ""); err == nil {
		return s, nil
	} else {
		fail(StepInitdb, err)
	}

	return nil, errors.New("no Postgres server found:\n  " + strings.Join(reasons, "\n  ") + "\n" +
		"Any one of these fixes it:\n" +
		"  - install the PostgreSQL server binaries (Debian/Ubuntu: apt-get install postgresql;\n" +
		"    initdb then makes a throw-away cluster in a temporary directory, nothing to configure);\n" +
		"  - run Postgres on 127.0.0.1:5432 letting user postgres in without a password (trust);\n" +
		"  - start a Docker engine (Debian: apt-get install docker.io) for a postgres:16-alpine container;\n" +
		"  - set " + o.URLVar + " to a server on which databases may be created.")
}

// CreateDatabase creates an empty database named prefix_<random> on the
// server at adminURL and returns its URL and a function that drops it.
func CreateDatabase(ctx context.Context, adminURL, prefix string) (string, func(context.Context) error, error) {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := prefix + "_" + hex.EncodeToString(b)
	if err := adminExec(ctx, adminURL, "CREATE DATABASE "+name); err != nil {
		return "", nil, fmt.Errorf("create database %s: %w", name, err)
	}
	drop := func(ctx context.Context) error {
		// FORCE ends the sessions of whatever did not close its pool.
		if err := adminExec(ctx, adminURL, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("drop database %s: %w", name, err)
		}
		return nil
	}
	return withDatabase(adminURL, name), drop, nil
}

// withDatabase points a connection string at another database.
func withDatabase(admin, name string) string {
	u, err := url.Parse(admin)
	if err != nil || u.Scheme == "" {
		// Key=value connection strings: a later dbname wins.
		return admin + " dbname=" + name
	}
	u.Path = "/" + name
	return u.String()
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

// allows checks that the server at u lets at least n clients connect at
// once; the error says how to let it.
func allows(ctx context.Context, u string, n int) error {
	if n <= 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var clients int
	if err := conn.QueryRow(ctx, `SELECT current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int`).Scan(&clients); err != nil {
		return err
	}
	if clients < n {
		return fmt.Errorf("it allows %d client connections, and up to %d are needed at once (to use it: ALTER SYSTEM SET max_connections = %d, and restart it)", clients, n, n+3)
	}
	return nil
}

// Ping connects to u and pings it within timeout.
func Ping(ctx context.Context, u string, timeout time.Duration) error {
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
	s := strings.ReplaceAll(err.Error(), "\n", " ")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
