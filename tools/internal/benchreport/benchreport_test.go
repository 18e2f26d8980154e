package benchreport

import (
	"bytes"
	"strings"
	"testing"
)

// Three storm batches (go test -count 3): every storm figure is their
// median. "grafana" refreshed twice per expiry in one batch and still once
// in the median; "coder" reused a refresh token, so its figures do not
// count.
const sample = `goos: linux
BenchmarkTokenHot/tokenguard-2         	26213610	        68.88 ns/op	         0 queries/op	       0 B/op	       0 allocs/op
BenchmarkTokenHot/tokenguard-2         	26213610	        71.12 ns/op	         0 queries/op	       0 B/op	       0 allocs/op
BenchmarkTokenHot/tokenguard-traced-2  	26213610	        75.00 ns/op	         0 queries/op	       0 B/op	       0 allocs/op
BenchmarkTokenHot/nango-2              	    5000	    210000 ns/op	    3354 B/op	      57 allocs/op
BenchmarkTokenHot/seed-2               	   20000	      5600 ns/op	    3354 B/op	      57 allocs/op
BenchmarkTokenHot/oauth2-reuse-2       	12298356	       127.8 ns/op	       0 B/op	       0 allocs/op
BenchmarkTokenHot/db-read-2            	   14013	     78691 ns/op	    3354 B/op	      57 allocs/op
BenchmarkRefreshStorm-2                	      10	  32543632 ns/op	        21.50 baseline-p50-ms	        24.00 baseline-p99-ms	         3.000 db-conns-peak/op	        24.00 floor-p50-ms	        27.90 floor-p99-ms	        24.25 p50-wait-ms	        53.56 p99-wait-ms	        20.00 provider-latency-ms	        21.50 provider-ms	         1.000 refreshes/op	         0 reuse/op	99.0 nango-p50-ms	211.7 nango-p99-ms	60 nango-db-conns-peak	1 nango-refreshes/op	0 nango-reuse/op	0 nango-errors/op	1100 grafana-p50-ms	1927 grafana-p99-ms	60 grafana-db-conns-peak	2 grafana-refreshes/op	0 grafana-reuse/op	231 grafana-errors/op	80 coder-p50-ms	139 coder-p99-ms	60 coder-db-conns-peak	1 coder-refreshes/op	1 coder-reuse/op	0 coder-errors/op
BenchmarkRefreshStorm-2                	      10	  32543632 ns/op	        21.50 baseline-p50-ms	        24.00 baseline-p99-ms	         3.000 db-conns-peak/op	        25.00 floor-p50-ms	        28.00 floor-p99-ms	        26.00 p50-wait-ms	        31.00 p99-wait-ms	        20.00 provider-latency-ms	        21.50 provider-ms	         1.000 refreshes/op	         0 reuse/op	99.0 nango-p50-ms	211.7 nango-p99-ms	60 nango-db-conns-peak	1 nango-refreshes/op	0 nango-reuse/op	0 nango-errors/op	1100 grafana-p50-ms	1927 grafana-p99-ms	60 grafana-db-conns-peak	1 grafana-refreshes/op	0 grafana-reuse/op	231 grafana-errors/op	80 coder-p50-ms	139 coder-p99-ms	60 coder-db-conns-peak	1 coder-refreshes/op	1 coder-reuse/op	0 coder-errors/op
BenchmarkRefreshStorm-2                	      10	  32543632 ns/op	        21.50 baseline-p50-ms	        24.00 baseline-p99-ms	         3.000 db-conns-peak/op	        26.00 floor-p50-ms	        29.00 floor-p99-ms	        40.00 p50-wait-ms	        34.00 p99-wait-ms	        20.00 provider-latency-ms	        21.50 provider-ms	         1.000 refreshes/op	         0 reuse/op	99.0 nango-p50-ms	211.7 nango-p99-ms	60 nango-db-conns-peak	1 nango-refreshes/op	0 nango-reuse/op	0 nango-errors/op	1100 grafana-p50-ms	1927 grafana-p99-ms	60 grafana-db-conns-peak	1 grafana-refreshes/op	0 grafana-reuse/op	231 grafana-errors/op	80 coder-p50-ms	139 coder-p99-ms	60 coder-db-conns-peak	1 coder-refreshes/op	1 coder-reuse/op	0 coder-errors/op
BenchmarkProactiveRefresh-2            	       1	25000000000 ns/op	       400.0 conns/s	       468.0 target-conns/s	        21.40 provider-ms	         0 reuse
BenchmarkProactiveRefreshNangoCron-2   	       1	25000000000 ns/op	        40.0 conns/s	         0 reuse
BenchmarkCacheMemory-2                 	       1	1834410295 ns/op	       459.1 B/conn
BenchmarkTokenAPIAtRate-2   	       1	         0.01924 db-xacts/req	         0.09982 empty-p50-ms	         0.9628 empty-p99-ms	         0.1056 p50-ms	         0.7200 p99-ms
BenchmarkProxyAtRate-2      	       1	         0.1071 direct-p50-ms	         0.3690 direct-p99-ms	         0.2308 p50-ms	         3.437 p99-ms
BenchmarkConnectionsListing-2   	       1	         1.619 p50-ms	        15.95 p99-ms	         0.9955 p99-ratio	         2.830 unlimited-p50-ms	        16.02 unlimited-p99-ms
PASS
`

func TestChecks(t *testing.T) {
	r, err := Read(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Check{}
	for _, c := range r.Checks() {
		got[c.What] = c
	}
	if c := got["hot path: tokenguard / oauth2-reuse"]; !c.Met || c.Value != "0.55x" {
		t.Errorf("ratio row %+v (median of two runs over 127.8)", c)
	}
	if c := got["hot path: with a tracer / without"]; !c.Met || c.Value != "1.07x" || c.Target != "<= 1.10x" {
		t.Errorf("traced hot path %+v (75.0 over the median 70.0)", c)
	}
	if c := got["hot path: nango (reads per call) / tokenguard"]; !c.Met || c.Value != "3000x" {
		t.Errorf("nango hot path %+v", c)
	}
	if c := got["hot path: seed (reads per call) / tokenguard"]; c.Met || c.Value != "80x" || c.By != "20x" {
		t.Errorf("seed hot path %+v", c)
	}
	if c := got["hot path: grafana (reads per call) / tokenguard"]; c.Found {
		t.Errorf("absent benchmark reported as found: %+v", c)
	}
	// Medians of three batches: p50 26.0 over a floor of 25.0, p99 34.0
	// over a floor of 28.0.
	if c := got["storm: p50 wait over the floor's (26.0 ms against 25.0), median of 3 batches"]; !c.Met || c.Value != "1.040x" || c.Target != "<= 1.10x" {
		t.Errorf("p50 floor row %+v", c)
	}
	if c := got["storm: p99 wait over the floor's (34.0 ms against 28.0), median of 3 batches"]; c.Met || c.Value != "1.214x" || c.By != "3.2 ms" {
		t.Errorf("p99 floor row %+v", c)
	}
	if c := got["storm: p99 wait over the provider-only storm's p99 (24.0 ms)"]; !c.Info || c.Value != "+10.0 ms" {
		t.Errorf("p99 baseline row %+v", c)
	}
	if c := got["storm: tokenguard's p99 below nango's (211.7 ms)"]; !c.Met || c.Value != "34.0 ms" {
		t.Errorf("nango p99 row %+v", c)
	}
	if c := got["storm: grafana refreshes per expiry, reuse (else its figures do not count)"]; !c.Met || c.Value != "1.00, 0" {
		t.Errorf("grafana validity row %+v (median of 2, 1, 1)", c)
	}
	if c := got["storm: coder refreshes per expiry, reuse (else its figures do not count)"]; c.Met || c.Value != "1.00, 1" {
		t.Errorf("coder validity row %+v", c)
	}
	if c := got["storm: tokenguard's p99 below coder's (139.0 ms)"]; c.Met || !c.Found || !strings.Contains(c.Value, "do not count") {
		t.Errorf("coder p99 row counted although coder reused a token: %+v", c)
	}
	if c := got["storm: grafana's failed calls per storm (of 600)"]; !c.Info || c.Value != "231" {
		t.Errorf("grafana errors row %+v", c)
	}
	if c := got["GET /token (cached), 1,000/s: p99 over an empty handler's (0.96 ms)"]; !c.Met || c.Value != "-0.24 ms" {
		t.Errorf("token API row %+v", c)
	}
	if c := got["proxy, 1,000/s: p99 over calling the upstream directly (0.37 ms)"]; c.Met || c.Value != "+3.07 ms" || c.By != "1.07 ms" {
		t.Errorf("proxy row %+v", c)
	}
	if c := got["GET /token (cached): database transactions per request (idle rate subtracted)"]; !c.Met || c.Value != "0.019" {
		t.Errorf("token API queries row %+v", c)
	}
	if c := got["proactive sweep / Nango's cron (pages of 100, one process: 40/s)"]; !c.Info || c.Value != "10.0x" {
		t.Errorf("cron row %+v", c)
	}
	if c := got["proactive sweep: conns/s vs concurrency / provider latency (21.4 ms seen)"]; !c.Met || c.Value != "400/s" {
		t.Errorf("sweep rate %+v", c)
	}
	if c := got["proactive sweep: reuse"]; !c.Met {
		t.Errorf("sweep reuse %+v", c)
	}
	if c := got["commit -> other process switched"]; c.Found {
		t.Errorf("absent benchmark reported as found: %+v", c)
	}
	var buf bytes.Buffer
	if Write(&buf, r.Checks()) {
		t.Error("all met although the p99 target was missed and a benchmark is absent")
	}
	for _, want := range []string{"not run", "NO, by 3.2 ms", "info"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, buf.String())
		}
	}
}

func TestPeerTable(t *testing.T) {
	r, err := Read(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	WritePeers(&buf, r.PeerRows())
	lines := strings.Split(buf.String(), "\n")
	row := func(design string) string {
		for _, l := range lines {
			if strings.HasPrefix(l, design+" ") {
				return l
			}
		}
		t.Fatalf("no row %s in\n%s", design, buf.String())
		return ""
	}
	// tokenguard: p50 26.0, p99 34.0, 3 connections, 70 ns.
	for _, want := range []string{"26.0 ms (1.0x)", "34.0 ms (1.0x)", "70 ns (1.0x)"} {
		if !strings.Contains(row("tokenguard"), want) {
			t.Errorf("tokenguard row lacks %q: %s", want, row("tokenguard"))
		}
	}
	for _, want := range []string{"99.0 ms (3.8x)", "211.7 ms (6.2x)", "60 (20.0x)", "210000 ns (3000.0x)", "yes"} {
		if !strings.Contains(row("nango"), want) {
			t.Errorf("nango row lacks %q: %s", want, row("nango"))
		}
	}
	if !strings.Contains(row("coder"), "NO") {
		t.Errorf("coder row counted: %s", row("coder"))
	}
	if !strings.Contains(row("grafana"), "231") {
		t.Errorf("grafana row lacks its failed calls: %s", row("grafana"))
	}
}

func TestSweepMissSaysWhichSide(t *testing.T) {
	for _, c := range []struct {
		rate float64
		by   string
	}{{200, "174/s below"}, {700, "138/s above"}, {468, ""}} {
		r := Results{"ProactiveRefresh": {"conns/s": {c.rate}, "target-conns/s": {468}, "provider-ms": {21.4}}}
		for _, row := range r.Checks() {
			if strings.HasPrefix(row.What, "proactive sweep: conns/s") && (row.By != c.by || row.Met != (c.by == "")) {
				t.Errorf("rate %v: %+v", c.rate, row)
			}
		}
	}
}

// Three batches of the standby's cost (go test -count 3): each figure is
// the median over the batches; in one batch the standby side refreshed
// twice, and in the median still once.
const standbySample = `goos: linux
BenchmarkRefreshStormStandby-2   	      15	 149072813 ns/op	         1.300 added-p50-ms	        44.00 added-p99-ms	        33.90 lone-p50-ms	        92.30 lone-p99-ms	         1.000 lone-refreshes/op	         0 lone-reuse/op	0.10 lone-commit-ms	1.20 standby-commit-ms	         1.038 p50-ratio	         1.476 p99-ratio	        20.00 provider-latency-ms	        35.20 standby-p50-ms	       136.3 standby-p99-ms	         1.000 standby-refreshes/op	         0 standby-reuse/op
BenchmarkRefreshStormStandby-2   	      15	 149072813 ns/op	         2.500 added-p50-ms	        10.00 added-p99-ms	        30.00 lone-p50-ms	        80.00 lone-p99-ms	         1.000 lone-refreshes/op	         0 lone-reuse/op	         1.083 p50-ratio	         1.125 p99-ratio	        20.00 provider-latency-ms	        32.50 standby-p50-ms	        90.00 standby-p99-ms	         2.000 standby-refreshes/op	         0 standby-reuse/op
BenchmarkRefreshStormStandby-2   	      15	 149072813 ns/op	         2.000 added-p50-ms	        20.00 added-p99-ms	        31.00 lone-p50-ms	        85.00 lone-p99-ms	         1.000 lone-refreshes/op	         0 lone-reuse/op	         1.070 p50-ratio	         1.235 p99-ratio	        20.00 provider-latency-ms	        33.00 standby-p50-ms	       105.0 standby-p99-ms	         1.000 standby-refreshes/op	         0 standby-reuse/op
PASS
`

func TestStandbyRows(t *testing.T) {
	r, err := Read(strings.NewReader(standbySample))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Check{}
	for _, c := range r.Checks() {
		got[c.What] = c
	}
	for what, want := range map[string]string{
		"standby's cost: storm p50, p99 on a lone server (token writes at synchronous_commit on), median of 3 batches": "31.0 ms, 85.0 ms",
		"standby's cost: storm p50, p99 on a primary with a synchronous standby (remote_apply), median of 3 batches":   "33.0 ms, 105.0 ms",
		"standby's cost: one commit's wait (median), lone (on) / with the synchronous standby (remote_apply)":          "0.10 ms / 1.20 ms",
		"standby's cost: storm p50 added by the synchronous standby (same batch), and the ratio":                       "+2.0 ms, 1.07x",
		"standby's cost: storm p99 added by the synchronous standby (same batch), and the ratio":                       "+20.0 ms, 1.24x",
	} {
		if c := got[what]; !c.Found || !c.Info || c.Value != want {
			t.Errorf("%s: %+v, want info %q", what, c, want)
		}
	}
	for what, want := range map[string]string{
		"standby's cost, lone: refreshes per expiry":    "1.00",
		"standby's cost, lone: refresh-token reuse":     "0",
		"standby's cost, standby: refreshes per expiry": "1.00",
		"standby's cost, standby: refresh-token reuse":  "0",
	} {
		if c := got[what]; !c.Met || c.Info || c.Value != want {
			t.Errorf("%s: %+v, want a target met with %q", what, c, want)
		}
	}

	// Reuse on the standby side in two batches: the target is missed.
	reused := strings.Replace(standbySample, "0 standby-reuse/op", "1 standby-reuse/op", 2)
	r, err = Read(strings.NewReader(reused))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range r.Checks() {
		if c.What == "standby's cost, standby: refresh-token reuse" && (c.Met || c.Value != "1") {
			t.Errorf("reuse in 2 of 3 batches: %+v", c)
		}
	}

	// Not run (no initdb: skipped): every row says so, none is met.
	r, err = Read(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range r.Checks() {
		if strings.HasPrefix(c.What, "standby's cost") && (c.Found || c.Met) {
			t.Errorf("absent benchmark reported: %+v", c)
		}
	}
}
