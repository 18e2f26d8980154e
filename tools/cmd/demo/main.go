// Command demo (make demo) shows tokenguard working for real: two sandbox
// providers with different quirks (the OAUTH_* one takes the client only
// by HTTP Basic; the other, stored with tokenctl provider add, only in the
// form body, and answers without expires_in), a fresh database, and the
// server, worker and batch apps as separate processes under load. It
// prints a table, writes demo-out/report.json and demo-out/report.html (a
// timeline of the run, self-contained) and exits non-zero if any call
// failed or any refresh token was reused at either provider.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/tokenguard/tokenguard/tools/internal/demo"
)

func main() {
	var o demo.Options
	flag.DurationVar(&o.Duration, "duration", 0, "load phase (default 30s)")
	flag.DurationVar(&o.TokenLifetime, "token-lifetime", 0, "access-token lifetime at the OAUTH_* sandbox provider (default 3s)")
	flag.DurationVar(&o.StoredTokenLifetime, "stored-token-lifetime", 0,
		"access-token lifetime at the stored provider's sandbox, which answers without expires_in (default twice --token-lifetime)")
	flag.DurationVar(&o.Skew, "skew", 0, "TOKEN_REFRESH_SKEW for the apps (default 1s)")
	flag.StringVar(&o.BinDir, "bin", "bin", "directory of the built apps")
	flag.StringVar(&o.OutDir, "out", "demo-out", "directory for logs and report.json")
	flag.Usage = func() {
		fmt.Fprint(flag.CommandLine.Output(), `usage: demo [flags]

Runs two sandbox providers, a fresh database (Postgres found or started as the tests find it), and the
built server, worker and batch as processes under load; prints what happened and writes report.json.

Flags:
`)
		flag.PrintDefaults()
		fmt.Fprint(flag.CommandLine.Output(), `
Environment:
  DATABASE_URL  a Postgres server to create the demo's database on (default: one found or started
                as the tests find it: 127.0.0.1:5432, Docker, initdb)
The apps are given their settings by the demo; the rest of the environment is passed to them.
`)
	}
	flag.Parse() // -h, --help: the usage above, exit 0
	if fi, err := os.Stdout.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		o.Live = true
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ok, err := demo.RunAndReport(ctx, o, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
	if !ok {
		os.Exit(1)
	}
}
