// Command soak (make soak) runs server, worker and batch as processes
// under load against the sandbox provider, on a throw-away Postgres
// cluster, while faults are injected at random (internal/soak). It prints
// the invariant table, writes soak-out/report.json and exits non-zero
// when an invariant failed.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/tokenguard/tokenguard/tools/internal/soak"
)

func main() {
	var o soak.Options
	flag.DurationVar(&o.Duration, "duration", 0, "fault phase (default 10m)")
	flag.DurationVar(&o.TokenLifetime, "token-lifetime", 0, "access-token lifetime at the sandbox provider (default 4s)")
	flag.DurationVar(&o.FaultGap, "fault-gap", 0, "mean time between faults (default 8s)")
	flag.Uint64Var(&o.Seed, "seed", 0, "seed of the fault schedule (default: from the clock)")
	flag.BoolVar(&o.Control, "control", false, "also kill inside the rotation window and answer refreshes after the client gave up: the invariants must then fail")
	flag.StringVar(&o.Failover, "failover", "", "sync or async: the failover soak, on a primary and a synchronous or asynchronous standby")
	flag.IntVar(&o.Failovers, "failovers", 0, "failover soak: how many failovers (default 10)")
	flag.StringVar(&o.BinDir, "bin", "bin", "directory of the built apps")
	flag.StringVar(&o.OutDir, "out", "soak-out", "directory for logs and report.json")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rep, err := soak.Run(ctx, o, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
	rep.Print(os.Stdout)
	if !rep.OK {
		os.Exit(1)
	}
}
