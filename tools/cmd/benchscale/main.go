// Command benchscale is make bench-scale: a fleet of app processes on one
// Postgres holding up to a million connections (internal/scalebench).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tokenguard/tokenguard/internal/pgserver"
	"github.com/tokenguard/tokenguard/tools/internal/scalebench"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "status" {
		if err := scalebench.Status(os.Environ(), os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "benchscale status:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "child" {
		if err := scalebench.Child(os.Environ(), os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "benchscale child:", err)
			os.Exit(1)
		}
		return
	}
	var o scalebench.Options
	sizes := flag.String("sizes", "1000,1000000", "table sizes (rows), comma-separated")
	caches := flag.String("caches", "1000,10000000", "TOKEN_CACHE_SIZE values, comma-separated (a huge one: unbounded)")
	flag.IntVar(&o.Procs, "procs", 8, "app processes")
	flag.IntVar(&o.WorkingSet, "working-set", 50000, "distinct connections each process touches")
	flag.IntVar(&o.Wave, "wave", 3000, "connections refreshed in waves during the run")
	flag.DurationVar(&o.Lifetime, "lifetime", 30*time.Second, "access token lifetime of the refreshed connections")
	flag.DurationVar(&o.Run, "run", 60*time.Second, "how long the fleet serves after touching its working sets")
	flag.IntVar(&o.Workers, "workers", 8, "goroutines per process calling Token")
	flag.IntVar(&o.Rate, "rate", 1000, "Token calls per second per process while serving")
	flag.DurationVar(&o.Latency, "provider-latency", 50*time.Millisecond, "the sandbox provider's refresh latency")
	flag.IntVar(&o.SweepConc, "sweep-concurrency", 8, "concurrency of the proactive sweep")
	flag.IntVar(&o.RSSBoundMB, "rss-bound-mb", 0, "fail if a process with TOKEN_CACHE_SIZE <= bounded-max has more RSS (MiB) after touching its working set")
	flag.IntVar(&o.BoundedMax, "bounded-max", 1000, "largest TOKEN_CACHE_SIZE the RSS bound applies to")
	flag.Parse()
	o.Sizes, o.Caches = ints(*sizes), ints(*caches)
	self, err := os.Executable()
	if err != nil {
		fail(err)
	}
	o.Self = self

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	srv, err := pgserver.Find(ctx, pgserver.Options{URLVar: "DATABASE_URL"})
	if err != nil {
		fail(err)
	}
	defer srv.Close()
	o.AdminURL = srv.URL
	fmt.Printf("benchscale: Postgres from %s; %d CPUs; load average at start: %s\n", srv.Source, runtime.NumCPU(), loadavg())
	res, err := scalebench.RunAll(ctx, o, os.Stdout)
	fmt.Printf("load average at end: %s\n\n", loadavg())
	scalebench.Table(os.Stdout, res)
	if err != nil {
		fail(err)
	}
	if o.RSSBoundMB > 0 {
		for _, r := range res {
			if r.Cache <= o.BoundedMax && slices.Max(r.TouchedRSSMB) > float64(o.RSSBoundMB) {
				fail(fmt.Errorf("%d rows, TOKEN_CACHE_SIZE=%d: a process has %.0f MiB RSS after touching %d connections, over the bound of %d MiB",
					r.Rows, r.Cache, slices.Max(r.TouchedRSSMB), o.WorkingSet, o.RSSBoundMB))
			}
		}
		fmt.Printf("\nmemory bound: every process with TOKEN_CACHE_SIZE <= %d stayed under %d MiB RSS\n", o.BoundedMax, o.RSSBoundMB)
	}
}

func ints(s string) []int {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			fail(fmt.Errorf("not a number: %q", f))
		}
		out = append(out, n)
	}
	return out
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "benchscale:", err)
	os.Exit(1)
}
