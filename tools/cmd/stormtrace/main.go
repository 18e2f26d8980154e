// Command stormtrace reads the execution traces BenchmarkRefreshStorm
// writes with STORM_TRACE set (docs/benchmarks.md, "Where a storm's time
// goes") and prints, for each storm, the callers' waits and the phases of
// its critical path, then the medians of each design (tokenguard, floor,
// provider-only: the part of the file name before the run number).
//
//	stormtrace dir/*.trace
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"text/tabwriter"
	"time"

	"github.com/tokenguard/tokenguard/tools/internal/benchreport"
)

var design = regexp.MustCompile(`^(.*?)-\d+-\d+\.trace$`)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: stormtrace file.trace...")
		os.Exit(2)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "storm\tp50\tp99\tspan\tarrived\tlock sent\tto provider\tprovider\tto commit\twake all\trelease\twoken p50\twoken p99\tpings\tprepares\tGC assists\t")
	var order []string
	byDesign := map[string][]benchreport.Storm{}
	for _, path := range os.Args[1:] {
		f, err := os.Open(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "stormtrace:", err)
			os.Exit(1)
		}
		s, err := benchreport.ReadStorm(f)
		_ = f.Close()
		if err != nil {
			fmt.Fprintf(os.Stderr, "stormtrace: %s: %v\n", path, err)
			os.Exit(1)
		}
		name := filepath.Base(path)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t\n", name, ms(s.P50), ms(s.P99), ms(s.Span),
			ms(s.Arrived), ms(s.LockSent), ms(s.ToProvider), ms(s.Provider), ms(s.ToCommit), ms(s.WakeAll), ms(s.Release), ms(s.WokenP50), ms(s.WokenP99),
			s.Pings, s.Prepares, s.GCAssists)
		d := name
		if m := design.FindStringSubmatch(name); m != nil {
			d = m[1]
		}
		if byDesign[d] == nil {
			order = append(order, d)
		}
		byDesign[d] = append(byDesign[d], s)
	}
	fmt.Fprintln(tw, "\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t")
	for _, d := range order {
		storms := byDesign[d]
		med := func(got func(benchreport.Storm) time.Duration) string {
			v, ok := benchreport.Median(storms, got)
			if !ok {
				return "-"
			}
			return ms(v)
		}
		fmt.Fprintf(tw, "%s: median of %d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\t\t\t\n", d, len(storms),
			med(func(s benchreport.Storm) time.Duration { return s.P50 }),
			med(func(s benchreport.Storm) time.Duration { return s.P99 }),
			med(func(s benchreport.Storm) time.Duration { return s.Span }),
			med(func(s benchreport.Storm) time.Duration { return s.Arrived }),
			med(func(s benchreport.Storm) time.Duration { return s.LockSent }),
			med(func(s benchreport.Storm) time.Duration { return s.ToProvider }),
			med(func(s benchreport.Storm) time.Duration { return s.Provider }),
			med(func(s benchreport.Storm) time.Duration { return s.ToCommit }),
			med(func(s benchreport.Storm) time.Duration { return s.WakeAll }),
			med(func(s benchreport.Storm) time.Duration { return s.Release }),
			med(func(s benchreport.Storm) time.Duration { return s.WokenP50 }),
			med(func(s benchreport.Storm) time.Duration { return s.WokenP99 }))
	}
	_ = tw.Flush()
}

func ms(d time.Duration) string {
	if d < 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", float64(d.Microseconds())/1000)
}
