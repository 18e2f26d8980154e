package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
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
	load := startAnswerLoad(s, conns, 2)
	time.Sleep(lifetime) // one refresh cycle before the window

	open.Store(true)
	opened := time.Now()
	time.Sleep(200 * time.Millisecond) // refreshes already past the check finish
	before := tokenRows(t, s.dbURL)
	expiry := tokenExpiry(t, s.dbURL)
	time.Sleep(window - 200*time.Millisecond)
	after := tokenRows(t, s.dbURL)
	open.Store(false)
	closed := time.Now()
	inWindow := rejected.Load()
	batchLinesAtClose := batchLineCount(batchApp)

	// Recovery: the server's first 200 per connection after the window,
	// and the batch's first round with every call succeeded.
	recovery := waitRecovery(load, batchApp, len(conns), closed, batchLinesAtClose)
	// The worker: events sent after the window complete at their first attempt.
	ids := postEventsRoundRobin(t, s, conns, 6)
	js := waitEvents(t, s.dbURL, ids, 15*time.Second)
	recovery["worker"] = time.Since(closed)
	answers := load.finish()
	// The server's answers in the window.
	during, lastMoment := answersInWindow(answers, opened.Add(200*time.Millisecond), closed, expiry)
	s.stop(batchApp)
	s.stop(worker)
	s.stop(server)
	dumpLogs(t, server, worker, batchApp)
	st := s.sb.Stats()

	var took []string
	var slowest time.Duration
	for _, k := range slices.Sorted(maps.Keys(recovery)) {
		took = append(took, fmt.Sprintf("%s %v", k, recovery[k].Round(10*time.Millisecond)))
		if k != "worker" {
			slowest = max(slowest, recovery[k])
		}
	}
	errLines, _ := appLines(clientRejectedLine, server, worker, batchApp)
	marks, _ := appLines(markedLine, server, worker, batchApp)
	t.Logf("window %v: server answers %v (and %d×401 in a token's last 250 ms); provider answered invalid_client %d times; %d ERROR lines about the client; %d needs-reauth lines",
		window, during, lastMoment, inWindow, errLines, marks)
	t.Logf("recovery after the window: %s (worker: events sent after the server recovered, all completed)", strings.Join(took, ", "))
	t.Logf("provider: %d refreshes, %d reuse", st.Refreshes, st.RefreshReuse)

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

// waitRecovery waits up to 20 s for the server's first 200 per
// connection after closed and the batch's first round with every call
// succeeded; it returns how long each took.
func waitRecovery(load *answerLoad, batchApp *app, conns int, closed time.Time, batchLinesAtClose int) map[string]time.Duration {
	recovery := map[string]time.Duration{}
	deadline := closed.Add(20 * time.Second)
	for len(recovery) < conns+1 && time.Now().Before(deadline) {
		for c, at := range load.firstOK(closed) {
			recovery["server/"+c] = at.Sub(closed)
		}
		if _, ok := recovery["batch"]; !ok && batchRecovered(batchApp, batchLinesAtClose) {
			recovery["batch"] = time.Since(closed)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return recovery
}

// postEventsRoundRobin posts n events across conns; each must be accepted.
func postEventsRoundRobin(t *testing.T, s *stack, conns []string, n int) []int64 {
	t.Helper()
	var ids []int64
	for i := range n {
		code, body := s.do(http.MethodPost, "/connections/"+conns[i%len(conns)]+"/events", fmt.Sprintf(`{"n":%d}`, i))
		var r struct {
			EventID int64 `json:"event_id"`
		}
		if code != http.StatusAccepted || json.Unmarshal([]byte(body), &r) != nil {
			t.Fatalf("event after the window: %d %s", code, body)
		}
		ids = append(ids, r.EventID)
	}
	return ids
}

// answersInWindow counts the server's answers between from and to by
// status and code. A token served in its last moment may meet the
// provider's own expiry, which precedes the one announced by the rounding
// of expires_in: such a 401 is counted apart.
func answersInWindow(answers []answer, from, to time.Time, expiry map[string]time.Time) (during map[string]int, lastMoment int) {
	during = map[string]int{}
	for _, a := range answers {
		switch {
		case a.at.Before(from) || a.at.After(to):
		case a.key == "401" && a.at.After(expiry[a.conn].Add(-250*time.Millisecond)):
			lastMoment++
		default:
			during[a.key]++
		}
	}
	return during, lastMoment
}

// answer is one server answer to GET resource.
type answer struct {
	at   time.Time
	conn string
	key  string // status, and the error code if any
}

// answerLoad calls GET resource for every connection from several clients
// and records every answer.
type answerLoad struct {
	stop chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	got  []answer
}

func startAnswerLoad(s *stack, conns []string, clients int) *answerLoad {
	l := &answerLoad{stop: make(chan struct{})}
	for _, c := range conns {
		for range clients {
			l.wg.Go(func() {
				for {
					select {
					case <-l.stop:
						return
					case <-time.After(20 * time.Millisecond):
					}
					code, body := s.do(http.MethodGet, "/connections/"+c+"/resource", "")
					a := answer{at: time.Now(), conn: c, key: fmt.Sprint(code)}
					var e struct {
						Code string `json:"code"`
					}
					if code != http.StatusOK && json.Unmarshal([]byte(body), &e) == nil && e.Code != "" {
						a.key += " " + e.Code
					}
					l.mu.Lock()
					l.got = append(l.got, a)
					l.mu.Unlock()
				}
			})
		}
	}
	return l
}

// firstOK is each connection's first 200 after since.
func (l *answerLoad) firstOK(since time.Time) map[string]time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]time.Time{}
	for _, a := range l.got {
		if _, ok := out[a.conn]; !ok && a.key == "200" && a.at.After(since) {
			out[a.conn] = a.at
		}
	}
	return out
}

func (l *answerLoad) finish() []answer {
	close(l.stop)
	l.wg.Wait()
	return l.got
}

// tokenExpiry is each connection's stored expiry.
func tokenExpiry(t *testing.T, dbURL string) map[string]time.Time {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT c.name, t.expiry FROM tokenguard_tokens t JOIN tokenguard_connections c ON c.id = t.connection_id`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]time.Time{}
	var name string
	var exp time.Time
	if _, err := pgx.ForEachRow(rows, []any{&name, &exp}, func() error { out[name] = exp; return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// tokenRows is the tokenguard_tokens table as stored, one text line per row.
func tokenRows(t *testing.T, dbURL string) []string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT concat_ws('|', c.name, t.access_token, t.refresh_token, t.expiry, t.obtained_at,
		t.version, t.status, t.status_reason, t.updated_at) FROM tokenguard_tokens t JOIN tokenguard_connections c ON c.id = t.connection_id ORDER BY c.name`)
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
