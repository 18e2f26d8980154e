package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokenguard/tokenguard/infra/batch"
	"github.com/tokenguard/tokenguard/internal/sandbox"
)

// clientRejectedLine is the ERROR line the use case writes, at most once a
// minute per connection and process, when the provider rejects the client.
const clientRejectedLine = "the token endpoint rejected the client"

// testInvalidClientWindow: while server, worker and batch use three
// connections, the provider answers every refresh 401 invalid_client for
// several seconds, as during a client-secret rotation. Every connection
// stays active with its tokens as they were, nobody reuses a refresh
// token, callers get a 503 client_rejected only once their token has
// expired, and all three apps recover by themselves within a few seconds
// after the window.
func testInvalidClientWindow(t *testing.T, bin string) {
	const (
		lifetime = 3 * time.Second
		skew     = time.Second
		window   = 6 * time.Second
	)
	var open atomic.Bool
	var rejected atomic.Int64
	s := newStack(t, bin, stackOpts{lifetime: lifetime, skew: skew, fault: func() sandbox.Fault {
		if !open.Load() {
			return sandbox.FaultNone
		}
		rejected.Add(1)
		return sandbox.FaultInvalidClient
	}})
	s.migrate()
	conns := []string{"a", "b", "c"}
	for _, c := range conns {
		s.importGrant(c)
	}
	server := s.start("server")
	s.waitHealthy(server)
	worker := s.start("worker")
	batchApp := s.start("batch", "--every", "300ms")
	loads := map[string]*statusLoad{}
	for _, c := range conns {
		loads[c] = startStatusLoad(s, c, 2)
	}
	time.Sleep(lifetime) // one refresh cycle before the window

	open.Store(true)
	for _, l := range loads {
		l.reset()
	}
	time.Sleep(200 * time.Millisecond) // refreshes already past the check finish
	before := tokenRows(t, s.dbURL)
	time.Sleep(window - 200*time.Millisecond)
	after := tokenRows(t, s.dbURL)
	open.Store(false)
	closed := time.Now()
	inWindow := rejected.Load()
	during := map[string]int{}
	for _, l := range loads {
		for k, n := range l.reset() {
			during[k] += n
		}
	}
	batchLinesAtClose := batchLineCount(batchApp)

	// Recovery: the server's first 200 per connection after the window,
	// and the batch's first round with every call succeeded.
	recovery := map[string]time.Duration{}
	deadline := closed.Add(20 * time.Second)
	for len(recovery) < len(conns)+1 && time.Now().Before(deadline) {
		for c, l := range loads {
			l.mu.Lock()
			if !l.firstOK.IsZero() {
				recovery["server/"+c] = l.firstOK.Sub(closed)
			}
			l.mu.Unlock()
		}
		if _, ok := recovery["batch"]; !ok && batchRecovered(batchApp, batchLinesAtClose) {
			recovery["batch"] = time.Since(closed)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The worker: events sent after the window complete at their first attempt.
	var ids []int64
	for i := range 6 {
		code, body := s.do(http.MethodPost, "/connections/"+conns[i%len(conns)]+"/events", fmt.Sprintf(`{"n":%d}`, i))
		var r struct {
			EventID int64 `json:"event_id"`
		}
		if code != http.StatusAccepted || json.Unmarshal([]byte(body), &r) != nil {
			t.Fatalf("event after the window: %d %s", code, body)
		}
		ids = append(ids, r.EventID)
	}
	js := waitEvents(t, s.dbURL, ids, 15*time.Second)
	recovery["worker"] = time.Since(closed)
	afterWindow := map[string]int{}
	for _, l := range loads {
		for k, n := range l.finish() {
			afterWindow[k] += n
		}
	}
	s.stop(batchApp)
	s.stop(worker)
	s.stop(server)
	dumpLogs(t, server, worker, batchApp)
	st := s.sb.Stats()

	var took []string
	var slowest time.Duration
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range recovery {
			if !yield(k) {
				return
			}
		}
	}) {
		took = append(took, fmt.Sprintf("%s %v", k, recovery[k].Round(10*time.Millisecond)))
		if k != "worker" {
			slowest = max(slowest, recovery[k])
		}
	}
	errLines, _ := appLines(clientRejectedLine, server, worker, batchApp)
	marks, _ := appLines(markedLine, server, worker, batchApp)
	t.Logf("window %v: server answers %v; provider answered invalid_client %d times; %d ERROR lines about the client; %d needs-reauth lines",
		window, during, inWindow, errLines, marks)
	t.Logf("recovery after the window: %s (worker: events sent after the server recovered, all completed)", strings.Join(took, ", "))
	t.Logf("after the window: server answers %v; provider: %d refreshes, %d reuse", afterWindow, st.Refreshes, st.RefreshReuse)

	if !slices.Equal(before, after) {
		t.Errorf("stored tokens changed during the window:\nbefore %q\nafter  %q", before, after)
	}
	for _, r := range tokenRows(t, s.dbURL) {
		if !strings.Contains(r, "|active|") {
			t.Errorf("connection not active after the window: %s", r[:strings.Index(r, "|")])
		}
	}
	for k := range during {
		if k != "200" && k != "503 client_rejected" {
			t.Errorf("server answered %q during the window: want 200 or 503 client_rejected", k)
		}
	}
	if during["200"] == 0 || during["503 client_rejected"] == 0 {
		t.Errorf("answers during the window %v: want still-valid tokens served, then 503 client_rejected", during)
	}
	if marks != 0 {
		t.Errorf("%d needs-reauth lines", marks)
	}
	if errLines == 0 || errLines > 3*len(conns) {
		t.Errorf("%d ERROR lines about the client, want 1..%d (one per connection and process)", errLines, 3*len(conns))
	}
	if st.RefreshReuse != 0 {
		t.Errorf("refresh-token reuse = %d", st.RefreshReuse)
	}
	if len(recovery) != len(conns)+2 || slowest > 15*time.Second {
		t.Errorf("recovered: %v", took)
	}
	for _, id := range ids {
		if j := js[id]; j.State != "completed" || j.Attempt != 1 {
			t.Errorf("event %d after the window: %+v", id, j)
		}
	}
}

// tokenRows is the tokens table as stored, one text line per row.
func tokenRows(t *testing.T, dbURL string) []string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT concat_ws('|', c.name, t.access_token, t.refresh_token, t.expiry, t.obtained_at,
		t.version, t.status, t.status_reason, t.updated_at) FROM tokens t JOIN connections c ON c.id = t.connection_id ORDER BY c.name`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func batchLineCount(a *app) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.lines)
}

// batchRecovered reports whether a round printed after the first skip
// lines had every call succeed.
func batchRecovered(a *app, skip int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, l := range a.lines[skip:] {
		var r batch.Round
		if json.Unmarshal([]byte(l), &r) == nil && r.Calls > 0 && r.Failed == 0 && len(r.Errors) == 0 {
			return true
		}
	}
	return false
}
