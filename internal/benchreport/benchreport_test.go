package benchreport

import (
	"bytes"
	"strings"
	"testing"
)

const sample = `goos: linux
BenchmarkTokenHot/tokenguard-2         	26213610	        68.88 ns/op	         0 queries/op	       0 B/op	       0 allocs/op
BenchmarkTokenHot/tokenguard-2         	26213610	        71.12 ns/op	         0 queries/op	       0 B/op	       0 allocs/op
BenchmarkTokenHot/oauth2-reuse-2       	12298356	       127.8 ns/op	       0 B/op	       0 allocs/op
BenchmarkTokenHot/db-read-2            	   14013	     78691 ns/op	    3354 B/op	      57 allocs/op
BenchmarkRefreshStorm-2                	      31	  32543632 ns/op	        21.50 baseline-p50-ms	        24.00 baseline-p99-ms	         3.000 db-conns-peak/op	        24.00 floor-p50-ms	        27.90 floor-p99-ms	        24.25 p50-wait-ms	        53.56 p99-wait-ms	        20.00 provider-latency-ms	        21.50 provider-ms	         1.000 refreshes/op	         0 reuse/op
BenchmarkCacheMemory-2                 	       1	1834410295 ns/op	       459.1 B/conn
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
		t.Errorf("ratio row %+v (mean of two runs over 127.8)", c)
	}
	if c := got["storm: p99 wait (provider 20 ms configured, 21.5 ms seen)"]; c.Met || c.Value != "53.6 ms" || c.Target != "<= 26.5 ms" {
		t.Errorf("p99 row %+v", c)
	}
	// The provider-only baseline gives context, and is no target.
	if c := got["storm: p50 wait over the provider-only storm's p50 (21.5 ms)"]; !c.Info || c.Value != "+2.8 ms" {
		t.Errorf("p50 baseline row %+v", c)
	}
	if c := got["storm: p99 wait over the provider-only storm's p99 (24.0 ms)"]; !c.Info || c.Value != "+29.6 ms" {
		t.Errorf("p99 baseline row %+v", c)
	}
	// So does the protocol floor, held to the same target for comparison.
	if c := got["storm: protocol floor's p99 (lock, provider, durable write; by hand)"]; !c.Info || c.Value != "27.9 ms" || c.Target != "(<= 26.5 ms)" {
		t.Errorf("floor row %+v", c)
	}
	if c := got["storm: p50 wait over the protocol floor's p50"]; !c.Info || c.Value != "+0.2 ms" {
		t.Errorf("p50 floor row %+v", c)
	}
	if c := got["storm: p99 wait over the protocol floor's p99"]; !c.Info || c.Value != "+25.7 ms" {
		t.Errorf("p99 floor row %+v", c)
	}
	if c := got["proactive sweep: reuse"]; c.Found {
		t.Errorf("absent benchmark reported as found: %+v", c)
	}
	var buf bytes.Buffer
	if Write(&buf, r.Checks()) {
		t.Error("all met although p99 missed and two benchmarks are absent")
	}
	if !strings.Contains(buf.String(), "not run") || !strings.Contains(buf.String(), "NO") || !strings.Contains(buf.String(), "info") {
		t.Errorf("table:\n%s", buf.String())
	}
}
