// Package benchreport turns `go test -bench` output into the table of
// ratios and targets that `make bench` prints. Every figure is computed
// from measurements of the same run; nothing is hard-coded but the targets.
package benchreport

import (
	"fmt"
	"io"
	"regexp"
	"slices"
	"text/tabwriter"
	"time"

	"golang.org/x/perf/benchfmt"
)

// Results maps a benchmark name (benchfmt drops "Benchmark"; the
// -GOMAXPROCS suffix is dropped here) to every value of each unit, one per
// run of it (go test -count).
type Results map[string]map[string][]float64

var procs = regexp.MustCompile(`-\d+$`)

// Read parses benchmark output.
func Read(r io.Reader) (Results, error) {
	out := Results{}
	br := benchfmt.NewReader(r, "bench")
	for br.Scan() {
		res, ok := br.Result().(*benchfmt.Result)
		if !ok {
			continue
		}
		name := procs.ReplaceAllString(res.Name.String(), "")
		if out[name] == nil {
			out[name] = map[string][]float64{}
		}
		for _, v := range res.Values {
			out[name][v.Unit] = append(out[name][v.Unit], v.Value)
		}
	}
	if err := br.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// get is the median over the runs: a batch disturbed by the machine moves
// it less than it moves a mean.
func (r Results) get(name, unit string) (float64, bool) {
	return median(slices.Clone(r[name][unit]))
}

// median sorts vs and returns its median; false when it is empty.
func median[T float64 | time.Duration](vs []T) (T, bool) {
	if len(vs) == 0 {
		return 0, false
	}
	slices.Sort(vs)
	if n := len(vs); n%2 == 0 {
		return (vs[n/2-1] + vs[n/2]) / 2, true
	}
	return vs[len(vs)/2], true
}

// runs is how many runs measured unit.
func (r Results) runs(name, unit string) int { return len(r[name][unit]) }

// Check is one row of the table.
type Check struct {
	What   string
	Value  string
	Target string
	Met    bool
	Found  bool
	Info   bool   // context for the targets, not a target itself
	By     string // how far a missed target was missed
}

// Peers are the designs BenchmarkRefreshStorm and BenchmarkTokenHot
// measure beside tokenguard (usecase/peers_test.go). Every one of them
// reads the database on each call, so the hot-path target applies to all.
var Peers = []string{"nango", "grafana", "coder", "seed"}

const (
	storm      = "RefreshStorm"
	standby    = "RefreshStormStandby"
	massExpiry = "MassExpiry"
	// tokenBudget is the fleet sharing a provider's token budget.
	tokenBudget = "TokenBudget"
	// connTimeBound is the most database connection time a refresh may
	// cost, whatever the provider's latency.
	connTimeBound = 5.0 // ms
	sweep         = "ProactiveRefresh"
	cron          = "ProactiveRefreshNangoCron"
	// floorFactor bounds tokenguard's storm waits over the protocol
	// floor's, measured in the same run.
	floorFactor = 1.10
	// hotPathFactor is how much cheaper tokenguard's hot path must be than
	// a design that reads the database on every call.
	hotPathFactor = 100.0
	// tracedFactor bounds the hot path with a tracer set over without.
	tracedFactor = 1.10
)

// peerValid says whether a peer's storm figures count: exactly one
// refresh per expiry and no refresh-token reuse.
func (r Results) peerValid(p string) (valid, found bool) {
	n, ok1 := r.get(storm, p+"-refreshes/op")
	reuse, ok2 := r.get(storm, p+"-reuse/op")
	return ok1 && ok2 && n == 1 && reuse == 0, ok1 && ok2
}

// Checks evaluates the performance targets.
func (r Results) Checks() []Check {
	var out []Check
	add := func(what, target string, found bool, value float64, format string, met bool) *Check {
		c := Check{What: what, Target: target, Found: found, Met: found && met}
		if found {
			c.Value = fmt.Sprintf(format, value)
		}
		out = append(out, c)
		return &out[len(out)-1]
	}
	info := func(what string, found bool, value float64, format string) {
		add(what, "-", found, value, format, true).Info = true
	}
	text := func(what string, found bool, value string) {
		c := add(what, "-", found, 0, "", true)
		c.Info = true
		if found {
			c.Value = value
		}
	}
	missBy := func(c *Check, format string, by float64) {
		if c.Found && !c.Met {
			c.By = fmt.Sprintf(format, by)
		}
	}

	tg, ok1 := r.get("TokenHot/tokenguard", "sec/op")
	re, ok2 := r.get("TokenHot/oauth2-reuse", "sec/op")
	db, ok3 := r.get("TokenHot/db-read", "sec/op")
	missBy(add("hot path: tokenguard / oauth2-reuse", "<= 1.5x", ok1 && ok2, tg/re, "%.2fx", tg/re <= 1.5), "%.2fx", tg/re-1.5)
	missBy(add("hot path: db-read / tokenguard", fmt.Sprintf(">= %.0fx", hotPathFactor), ok1 && ok3, db/tg, "%.0fx", db/tg >= hotPathFactor), "%.0fx", hotPathFactor-db/tg)
	for _, p := range Peers {
		ps, ok := r.get("TokenHot/"+p, "sec/op")
		missBy(add(fmt.Sprintf("hot path: %s (reads per call) / tokenguard", p), fmt.Sprintf(">= %.0fx", hotPathFactor), ok1 && ok, ps/tg, "%.0fx", ps/tg >= hotPathFactor),
			"%.0fx", hotPathFactor-ps/tg)
	}
	// A cache hit records no span: a tracer set costs nothing measurable.
	traced, ok := r.get("TokenHot/tokenguard-traced", "sec/op")
	missBy(add("hot path: with a tracer / without", fmt.Sprintf("<= %.2fx", tracedFactor), ok1 && ok, traced/tg, "%.2fx", traced/tg <= tracedFactor),
		"%.2fx", traced/tg-tracedFactor)
	// What a DPoP-bound call costs on top: a proof signed per request.
	dpopCall, ok := r.get("TokenHot/tokenguard-dpop-proof", "sec/op")
	info("hot path of a DPoP-bound call (token + ES256 proof) / oauth2-reuse", ok2 && ok, dpopCall/re, "%.0fx")
	allocs, ok := r.get("TokenHot/tokenguard", "allocs/op")
	add("hot path: allocations per call", "0", ok, allocs, "%.0f", allocs == 0)
	q, ok := r.get("TokenHot/tokenguard", "queries/op")
	add("hot path: queries per call", "0", ok, q, "%.0f", q == 0)

	refreshes, ok := r.get(storm, "refreshes/op")
	add("storm (3 stacks x 200): refreshes per expiry", "exactly 1", ok, refreshes, "%.2f", refreshes == 1)
	reuse, ok := r.get(storm, "reuse/op")
	add("storm: refresh-token reuse", "0", ok, reuse, "%.0f", reuse == 0)
	conns, ok := r.get(storm, "db-conns-peak/op")
	// One per process: the lease is written in the lock's transaction.
	add("storm: peak database connections", "<= 3", ok, conns, "%.0f", conns <= 3)

	// Each storm figure is the median over the batches (go test -count).
	batches := r.runs(storm, "p50-wait-ms")
	p50, p50ok := r.get(storm, "p50-wait-ms")
	p99, p99ok := r.get(storm, "p99-wait-ms")
	floor50, f50ok := r.get(storm, "floor-p50-ms")
	floor99, f99ok := r.get(storm, "floor-p99-ms")
	info("storm: protocol floor's p50 (lease under the lock, provider, write under the lock; by hand)", f50ok, floor50, "%.1f ms")
	info("storm: protocol floor's p99", f99ok, floor99, "%.1f ms")
	target := fmt.Sprintf("<= %.2fx", floorFactor)
	missBy(add(fmt.Sprintf("storm: p50 wait over the floor's (%.1f ms against %.1f), median of %d batches", p50, floor50, batches), target, p50ok && f50ok, p50/floor50, "%.3fx", p50 <= floor50*floorFactor),
		"%.1f ms", p50-floor50*floorFactor)
	missBy(add(fmt.Sprintf("storm: p99 wait over the floor's (%.1f ms against %.1f), median of %d batches", p99, floor99, batches), target, p99ok && f99ok, p99/floor99, "%.3fx", p99 <= floor99*floorFactor),
		"%.1f ms", p99-floor99*floorFactor)
	// The same storm with nothing but the provider call: what the machine
	// makes of waiting for the provider.
	base50, ok := r.get(storm, "baseline-p50-ms")
	info(fmt.Sprintf("storm: p50 wait over the provider-only storm's p50 (%.1f ms)", base50), p50ok && ok, p50-base50, "%+.1f ms")
	base99, ok := r.get(storm, "baseline-p99-ms")
	info(fmt.Sprintf("storm: p99 wait over the provider-only storm's p99 (%.1f ms)", base99), p99ok && ok, p99-base99, "%+.1f ms")

	// What a synchronous standby costs the same storm: no target for the
	// cost, which is the replication round trip of this machine; the
	// once-per-expiry rule holds on both clusters.
	sbatches := r.runs(standby, "added-p99-ms")
	for _, side := range []struct{ prefix, what string }{
		{"lone", "a lone server (token writes at synchronous_commit on)"},
		{"standby", "a primary with a synchronous standby (remote_apply)"},
	} {
		p50, ok1 := r.get(standby, side.prefix+"-p50-ms")
		p99, ok2 := r.get(standby, side.prefix+"-p99-ms")
		text(fmt.Sprintf("standby's cost: storm p50, p99 on %s, median of %d batches", side.what, sbatches), ok1 && ok2,
			fmt.Sprintf("%.1f ms, %.1f ms", p50, p99))
		n, ok := r.get(standby, side.prefix+"-refreshes/op")
		add(fmt.Sprintf("standby's cost, %s: refreshes per expiry", side.prefix), "exactly 1", ok, n, "%.2f", n == 1)
		ru, ok := r.get(standby, side.prefix+"-reuse/op")
		add(fmt.Sprintf("standby's cost, %s: refresh-token reuse", side.prefix), "0", ok, ru, "%.0f", ru == 0)
	}
	lc, ok1 := r.get(standby, "lone-commit-ms")
	sc, ok2 := r.get(standby, "standby-commit-ms")
	text("standby's cost: one commit's wait (median), lone (on) / with the synchronous standby (remote_apply)", ok1 && ok2,
		fmt.Sprintf("%.2f ms / %.2f ms", lc, sc))
	for _, q := range []string{"p50", "p99"} {
		added, ok1 := r.get(standby, "added-"+q+"-ms")
		ratio, ok2 := r.get(standby, q+"-ratio")
		text(fmt.Sprintf("standby's cost: storm %s added by the synchronous standby (same batch), and the ratio", q), ok1 && ok2,
			fmt.Sprintf("%+.1f ms, %.2fx", added, ratio))
	}

	var c *Check
	for _, p := range Peers {
		valid, found := r.peerValid(p)
		n, _ := r.get(storm, p+"-refreshes/op")
		ru, _ := r.get(storm, p+"-reuse/op")
		c = add(fmt.Sprintf("storm: %s refreshes per expiry, reuse (else its figures do not count)", p), "1, 0", found, 0, "", valid)
		if found {
			c.Value = fmt.Sprintf("%.2f, %.0f", n, ru)
		}
		pp99, ok := r.get(storm, p+"-p99-ms")
		c = add(fmt.Sprintf("storm: tokenguard's p99 below %s's (%.1f ms)", p, pp99), fmt.Sprintf("< %.1f ms", pp99), ok && p99ok, p99, "%.1f ms", valid && p99 < pp99)
		switch {
		case c.Found && !valid:
			c.Value += " (" + p + "'s do not count)"
		default:
			missBy(c, "%.1f ms", p99-pp99)
		}
		errs, ok := r.get(storm, p+"-errors/op")
		info(fmt.Sprintf("storm: %s's failed calls per storm (of 600)", p), ok, errs, "%.0f")
	}

	for _, latency := range []string{"20ms", "1s"} {
		held, ok := r.get("ConnectionTime/provider="+latency, "db-conn-ms/refresh")
		missBy(add(fmt.Sprintf("database connection time per refresh, provider %s", latency), fmt.Sprintf("<= %.0f ms", connTimeBound), ok, held, "%.2f ms", held <= connTimeBound),
			"%.2f ms", held-connTimeBound)
		floor, ok := r.get("ConnectionTime/provider="+latency, "floor-db-conn-ms/refresh")
		info(fmt.Sprintf("the protocol floor's transaction time per refresh (its SQL by hand, one pgx connection), provider %s", latency), ok, floor, "%.2f ms")
		first, ok := r.get("ConnectionTime/provider="+latency, "first-refresh-db-conn-ms")
		info(fmt.Sprintf("database connection time of a process's first refresh (opens and prepares), provider %s", latency), ok, first, "%.2f ms")
	}
	secs, ok1 := r.get(massExpiry, "seconds/expiry")
	want, ok2 := r.get(massExpiry, "target-seconds")
	missBy(add("mass expiry (1,000 connections, 3 processes x pool 4, provider 1 s): time", fmt.Sprintf("%.1f s +-20%%", want), ok1 && ok2, secs, "%.1f s", secs >= 0.8*want && secs <= 1.2*want),
		"%.1f s", secs-1.2*want)
	mfailed, ok := r.get(massExpiry, "failed/op")
	add("mass expiry: failed calls", "0", ok, mfailed, "%.0f", mfailed == 0)
	mref, ok := r.get(massExpiry, "refreshes/conn")
	add("mass expiry: refreshes per connection", "exactly 1", ok, mref, "%.2f", mref == 1)
	mcalls, ok := r.get(massExpiry, "store-calls/conn")
	info("mass expiry: store calls per connection (reads, lock transactions, writes of the 3 processes)", ok, mcalls, "%.1f")
	inFlight, ok := r.get(massExpiry, "provider-calls-in-flight")
	info("mass expiry: provider calls in flight on average (of 3 x 64)", ok, inFlight, "%.0f")
	busiest, ok := r.get(massExpiry, "busiest-process-refreshes")
	info("mass expiry: refreshes of the busiest process (of 1,000)", ok, busiest, "%.0f")
	mreuse, ok := r.get(massExpiry, "reuse")
	add("mass expiry: refresh-token reuse", "0", ok, mreuse, "%.0f", mreuse == 0)
	backends, ok1 := r.get(massExpiry, "backends-peak")
	bound, ok2 := r.get(massExpiry, "backends-bound")
	add("mass expiry: peak Postgres backends (3 x 4 pool + 3 listeners)", fmt.Sprintf("<= %.0f", bound), ok1 && ok2, backends, "%.0f", backends <= bound)

	budgetRefusals, ok := r.get(tokenBudget, "refusals/op")
	add("token budget 20/1s (300 connections stale at once, 3 processes): provider refusals", "0", ok, budgetRefusals, "%.0f", budgetRefusals == 0)
	budgetFailed, ok := r.get(tokenBudget, "failed/op")
	add("token budget: failed calls (every token still valid)", "0", ok, budgetFailed, "%.0f", budgetFailed == 0)
	budgetSecs, ok1 := r.get(tokenBudget, "seconds-to-refresh-all")
	budgetWant, ok2 := r.get(tokenBudget, "target-seconds")
	missBy(add("token budget: all 300 refreshed", fmt.Sprintf("<= %.1f s + 10%%", budgetWant), ok1 && ok2, budgetSecs, "%.1f s", budgetSecs <= 1.1*budgetWant),
		"%.1f s", budgetSecs-1.1*budgetWant)
	budgetWindow, ok := r.get(tokenBudget, "max-requests-in-a-second")
	info("token budget: most token requests the provider saw in any second", ok, budgetWindow, "%.0f")
	controlRefusals, ok := r.get(tokenBudget, "control-refusals/op")
	add("token budget: control without the budget, provider refusals", "> 0", ok, controlRefusals, "%.0f", controlRefusals > 0)

	rate, ok1 := r.get(sweep, "conns/s")
	want, ok2 = r.get(sweep, "target-conns/s")
	pms, _ := r.get(sweep, "provider-ms")
	c = add(fmt.Sprintf("proactive sweep: conns/s vs concurrency / provider latency (%.1f ms seen)", pms), fmt.Sprintf("%.0f/s +-20%%", want), ok1 && ok2, rate, "%.0f/s", rate >= 0.8*want && rate <= 1.2*want)
	if rate < 0.8*want {
		missBy(c, "%.0f/s below", 0.8*want-rate)
	} else {
		missBy(c, "%.0f/s above", rate-1.2*want)
	}
	sreuse, ok := r.get(sweep, "reuse")
	add("proactive sweep: reuse", "0", ok, sreuse, "%.0f", sreuse == 0)
	nango, ok3 := r.get(cron, "conns/s")
	info(fmt.Sprintf("proactive sweep / Nango's cron (pages of 100, one process: %.0f/s)", nango), ok1 && ok3, rate/nango, "%.1fx")
	creuse, ok := r.get(cron, "reuse")
	add("Nango's cron: reuse", "0", ok, creuse, "%.0f", creuse == 0)

	bconn, ok := r.get("CacheMemory", "B/conn")
	add("memory per cached connection", "<= 1024 B", ok, bconn, "%.0f B", bconn <= 1024)
	inv, ok := r.get("Invalidate", "invalidate-ms")
	add("commit -> other process switched", "<= 50 ms", ok, inv, "%.1f ms", inv <= 50)

	// The server's token API and proxy at a fixed rate (infra/httpapi).
	emptyP99, ok1 := r.get(tokenAPI, "empty-p99-ms")
	tokP99, ok2 := r.get(tokenAPI, "p99-ms")
	c = add(fmt.Sprintf("GET /token (cached), 1,000/s: p99 over an empty handler's (%.2f ms)", emptyP99), "<= +1.0 ms", ok1 && ok2,
		tokP99-emptyP99, "%+.2f ms", tokP99-emptyP99 <= 1)
	missBy(c, "%.2f ms", tokP99-emptyP99-1)
	xacts, ok := r.get(tokenAPI, "db-xacts/req")
	add("GET /token (cached): database transactions per request (idle rate subtracted)", "~0 (< 0.1)", ok, xacts, "%.3f", xacts < 0.1)
	directP99, ok1 := r.get(proxyAPI, "direct-p99-ms")
	proxyP99, ok2 := r.get(proxyAPI, "p99-ms")
	c = add(fmt.Sprintf("proxy, 1,000/s: p99 over calling the upstream directly (%.2f ms)", directP99), "<= +2.0 ms", ok1 && ok2,
		proxyP99-directP99, "%+.2f ms", proxyP99-directP99 <= 2)
	missBy(c, "%.2f ms", proxyP99-directP99-2)
	// A listing for a key limited by patterns, against an unlimited key's.
	ratio, ok := r.get(listing, "p99-ratio")
	add("GET /connections of 100,000: p99 for a key limited to tenant-a-* / an unlimited key's", "<= 2x", ok, ratio, "%.2fx", ratio <= 2)
	return out
}

const (
	tokenAPI = "TokenAPIAtRate"
	proxyAPI = "ProxyAtRate"
	listing  = "ConnectionsListing"
)

// PeerRow is one design in the peer table: its figures and each one's
// ratio to tokenguard's in the same run.
type PeerRow struct {
	Design                             string
	Valid                              bool // refreshed once per expiry without reuse
	P50, P99, Conns, Refreshes, Failed float64
	HotNs                              float64
	Found                              [6]bool // of P50, P99, Conns, Refreshes, Failed, HotNs
}

// PeerRows are tokenguard's storm and hot-path figures and every peer's.
func (r Results) PeerRows() []PeerRow {
	row := func(design, prefix string, valid bool) PeerRow {
		pr := PeerRow{Design: design, Valid: valid}
		ok := &pr.Found
		if prefix == "" { // tokenguard's own units
			pr.P50, ok[0] = r.get(storm, "p50-wait-ms")
			pr.P99, ok[1] = r.get(storm, "p99-wait-ms")
			pr.Conns, ok[2] = r.get(storm, "db-conns-peak/op")
			pr.Refreshes, ok[3] = r.get(storm, "refreshes/op")
			pr.Failed, ok[4] = 0, ok[3] // its calls fail the benchmark
		} else {
			pr.P50, ok[0] = r.get(storm, prefix+"p50-ms")
			pr.P99, ok[1] = r.get(storm, prefix+"p99-ms")
			pr.Conns, ok[2] = r.get(storm, prefix+"db-conns-peak")
			pr.Refreshes, ok[3] = r.get(storm, prefix+"refreshes/op")
			pr.Failed, ok[4] = r.get(storm, prefix+"errors/op")
		}
		sec, found := r.get("TokenHot/"+design, "sec/op")
		pr.HotNs, ok[5] = sec*1e9, found
		return pr
	}
	rows := []PeerRow{row("tokenguard", "", true)}
	for _, p := range Peers {
		valid, _ := r.peerValid(p)
		rows = append(rows, row(p, p+"-", valid))
	}
	return rows
}

// WritePeers prints the peer table: each figure, and in brackets its
// ratio to tokenguard's.
func WritePeers(w io.Writer, rows []PeerRow) {
	if len(rows) == 0 {
		return
	}
	base := rows[0]
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "design\tstorm p50\tstorm p99\tDB conns at peak\tprovider calls/expiry\tfailed calls/storm\thot path per call\tcounts")
	cell := func(found bool, v, b float64, format string) string {
		if !found {
			return "-"
		}
		s := fmt.Sprintf(format, v)
		if b > 0 {
			s += fmt.Sprintf(" (%.1fx)", v/b)
		}
		return s
	}
	for _, p := range rows {
		counts := "yes"
		switch {
		case !p.Found[3]:
			counts = "not run"
		case !p.Valid:
			counts = "NO: not once per expiry without reuse"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Design,
			cell(p.Found[0], p.P50, base.P50, "%.1f ms"),
			cell(p.Found[1], p.P99, base.P99, "%.1f ms"),
			cell(p.Found[2], p.Conns, base.Conns, "%.0f"),
			cell(p.Found[3], p.Refreshes, base.Refreshes, "%.2f"),
			cell(p.Found[4], p.Failed, 0, "%.0f"),
			cell(p.Found[5], p.HotNs, base.HotNs, "%.0f ns"),
			counts)
	}
	_ = tw.Flush()
}

// Write prints the table and reports whether every target was met.
func Write(w io.Writer, checks []Check) bool {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tmeasured\ttarget\tmet")
	all := true
	for _, c := range checks {
		met := "yes"
		switch {
		case !c.Found:
			met, c.Value = "not run", "-"
		case c.Info:
			met = "info"
		case !c.Met && c.By != "":
			met = "NO, by " + c.By
		case !c.Met:
			met = "NO"
		}
		all = all && (c.Met || c.Info)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", c.What, c.Value, c.Target, met)
	}
	_ = tw.Flush()
	return all
}
