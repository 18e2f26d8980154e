package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Failover modes (Options.Failover).
const (
	FailoverSync  = "sync"  // commits wait for the standby
	FailoverAsync = "async" // they do not: a failover can lose the last ones
)

const fFailover = "failover"

// msgRegressed is the use case's ERROR line when a connection is stored
// behind a version it knew committed (usecase/regress.go).
const msgRegressed = "connection's stored token went back to an older version"

// msgWrittenBack is the library's WARN line when the process that stored a
// rotation finds the database lost it and stores it again (repository/kept.go).
const msgWrittenBack = "tokenguard: a rotation the database lost"

// Failover is one failover and what it cost.
type Failover struct {
	At        string `json:"at"`
	DuringRef bool   `json:"during_refresh"` // the replication was cut right as a refresh answered
	Isolated  string `json:"isolated"`       // the primary ran cut off from its standby this long before it stopped
	Promoted  string `json:"promoted"`       // primary stopped until the standby accepted writes
	Rebuilt   string `json:"rebuilt"`        // until the old primary streamed again as a standby
	Recovery  string `json:"recovery"`       // until a resource call, an event and a batch round succeeded again
	Failed    int    `json:"failed_calls"`   // calls failed from the stop until recovery
	// Rotations stored since the previous failover, as the apps logged
	// them (committed), and how many of those the promoted standby had
	// (kept).
	Committed int `json:"rotations_committed"`
	Kept      int `json:"rotations_kept"`
	// Lost: versions the apps had committed that the promoted standby
	// did not have, by connection.
	Lost map[string]int64 `json:"lost_versions,omitempty"`
	// Detected: connections the apps reported stored behind a version
	// they knew (ERROR line), distinct.
	Detected []string `json:"regressions_detected,omitempty"`
	// WrittenBack: connections whose lost rotation the process that stored
	// it wrote again (WARN line), distinct.
	WrittenBack []string `json:"written_back,omitempty"`
	Reuse       int64    `json:"provider_reuse"`         // refresh-token reuse at the provider in its window
	Reauth      []string `json:"needs_reauth,omitempty"` // connections marked needs_reauth (name: reason)
	Webhooks    int      `json:"rolled_back_webhooks"`   // connection.rolled_back events delivered, distinct ids
	// EventsExempt: events accepted from a second before the cut until
	// the promotion, left out of the events invariant with an
	// asynchronous standby (their commits may be lost with it).
	EventsExempt int `json:"events_exempt,omitempty"`
	start        time.Time
	ready        time.Time
}

// versionLog follows, from the apps' logs, the newest version each
// connection was stored at, the rotations stored, and the regressions
// reported.
type versionLog struct {
	mu        sync.Mutex
	stored    map[string]int64 // connection -> newest version an app logged stored
	rotations int              // "token refresh" lines with outcome ok
	regressed map[string]bool  // "connection known stored" reported
	regLines  []string         // in order
	written   []string         // connections written back, in order (msgWrittenBack)
}

func (v *versionLog) line(l string) {
	if !strings.Contains(l, `"token refresh"`) && !strings.Contains(l, msgRegressed) && !strings.Contains(l, msgWrittenBack) {
		return
	}
	var rec struct {
		Msg        string `json:"msg"`
		Connection string `json:"connection"`
		Outcome    string `json:"outcome"`
		NewVersion int64  `json:"new_version"`
		Known      int64  `json:"known_version"`
		Stored     int64  `json:"stored_version"`
	}
	if json.Unmarshal([]byte(l), &rec) != nil {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.stored == nil {
		v.stored, v.regressed = map[string]int64{}, map[string]bool{}
	}
	switch {
	case rec.Msg == "token refresh" && rec.NewVersion > 0:
		v.stored[rec.Connection] = max(v.stored[rec.Connection], rec.NewVersion)
		if rec.Outcome == "ok" {
			v.rotations++
		}
	case strings.HasPrefix(rec.Msg, msgWrittenBack):
		v.written = append(v.written, rec.Connection)
	case strings.HasPrefix(rec.Msg, msgRegressed):
		key := fmt.Sprintf("%s %d %d", rec.Connection, rec.Known, rec.Stored)
		if !v.regressed[key] {
			v.regressed[key] = true
			v.regLines = append(v.regLines, key)
		}
	}
}

func (v *versionLog) snapshot() (map[string]int64, int, int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	m := map[string]int64{}
	for k, n := range v.stored {
		m[k] = n
	}
	return m, v.rotations, len(v.regLines)
}

// writtenBackSince: the connections written back after the first n, and how many there are now.
func (v *versionLog) writtenBackSince(n int) ([]string, int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	var out []string
	for _, c := range v.written[min(n, len(v.written)):] {
		if !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out, len(v.written)
}

func (v *versionLog) regressionsFrom(i int) []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	if i >= len(v.regLines) {
		return nil
	}
	return append([]string(nil), v.regLines[i:]...)
}

// hooks receives the worker's webhook deliveries.
type hooks struct {
	mu   sync.Mutex
	seen map[string]string // event id -> type
}

func (h *hooks) serve() (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 64<<10))
		var e struct{ ID, Type string }
		if json.Unmarshal(body, &e) == nil && e.ID != "" {
			h.mu.Lock()
			if h.seen == nil {
				h.seen = map[string]string{}
			}
			h.seen[e.ID] = e.Type
			h.mu.Unlock()
		}
		w.WriteHeader(http.StatusNoContent)
	})}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String() + "/hooks", func() { _ = srv.Close() }, nil
}

func (h *hooks) count(typ string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, t := range h.seen {
		if t == typ {
			n++
		}
	}
	return n
}

// failovers fails the cluster over Options.Failovers times, at random
// moments FaultGap apart on average, half of them right as a refresh
// answered (its commit in flight), and measures each.
func (s *soak) failovers(ctx context.Context) {
	for i := 0; i < s.o.Failovers && ctx.Err() == nil; i++ {
		sleep(ctx, time.Duration(float64(s.o.FaultGap)*(0.5+s.rng.Float64())))
		if ctx.Err() != nil {
			return
		}
		during := s.rng.IntN(2) == 0
		if during {
			s.awaitRefreshAnswer(ctx, 10*time.Second)
		}
		f := s.failover(ctx, during)
		s.fo.mu.Lock()
		s.fo.all = append(s.fo.all, f)
		s.fo.mu.Unlock()
	}
}

// awaitRefreshAnswer returns as soon as the provider answered a token
// request (within the last 20ms), or after within.
func (s *soak) awaitRefreshAnswer(ctx context.Context, within time.Duration) {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		s.gate.mu.Lock()
		for _, at := range s.gate.lastDone {
			if time.Since(at) < 20*time.Millisecond {
				s.gate.mu.Unlock()
				return
			}
		}
		s.gate.mu.Unlock()
		time.Sleep(2 * time.Millisecond)
	}
}

type failoverLog struct {
	mu  sync.Mutex
	all []*Failover
}

func (s *soak) failover(ctx context.Context, during bool) *Failover {
	f := &Failover{DuringRef: during, start: time.Now()}
	f.At = fmtOffset(s.since(f.start))
	fault := &Fault{Kind: fFailover, At: f.At, start: f.start}
	_, rotationsBefore, regBefore := s.versions.snapshot()
	_, writtenBefore := s.versions.writtenBackSince(0)
	reuseBefore := s.sb.Stats().RefreshReuse
	var committed, kept map[string]int64
	isolated := time.Duration(s.rng.IntN(300)) * time.Millisecond
	times, err := s.pair.Failover(context.WithoutCancel(ctx), isolated, func(ctx context.Context, standby string) {
		// The apps' lines of commits the old primary acknowledged are in
		// by now: nothing has been able to commit since it stopped.
		time.Sleep(300 * time.Millisecond)
		committed, _, _ = s.versions.snapshot()
		kept = s.standbyVersions(ctx, standby)
	})
	f.ready = time.Now()
	if s.o.Failover == FailoverAsync {
		// Enqueued in commits the standby may never have had; the
		// tokens are what this soak follows.
		f.EventsExempt = s.events.exemptBetween(f.start.Add(-time.Second), f.ready)
	}
	f.Promoted, f.Rebuilt = round(times.Promoted), round(times.Rebuilt)
	f.Isolated = isolated.String()
	fault.Detail = fmt.Sprintf("replication cut%s, primary stopped (-m immediate) %s later, standby promoted after %s, old primary a standby again after %s",
		map[bool]string{true: " right as a refresh answered", false: ""}[during], isolated, f.Promoted, f.Rebuilt)
	if err != nil {
		fault.Detail += " (" + err.Error() + ")"
		s.say("%7s  %-21s %s", f.At, fFailover, fault.Detail)
		fault.end = time.Now()
		s.faults.add(fault)
		return f
	}
	s.say("%7s  %-21s %s", f.At, fFailover, fault.Detail)
	f.Lost = map[string]int64{}
	for name, v := range committed {
		if d := v - kept[name]; d > 0 {
			f.Lost[name] = d
		}
	}
	f.Committed = s.versionsCommittedSince(rotationsBefore)
	// Let the apps find out: every access token expires in this time and
	// is refreshed, so a lost rotation meets the provider.
	sleep(ctx, s.o.TokenLifetime+8*time.Second)
	for _, kind := range []string{"resource", "event", "batch"} {
		ok, found := s.calls.firstOKAfter(kind, f.ready)
		if !found {
			f.Recovery = "never"
			break
		}
		f.Recovery = round(max(ok.Sub(f.start), parseDur(f.Recovery)))
	}
	f.Detected = s.versions.regressionsFrom(regBefore)
	f.WrittenBack, _ = s.versions.writtenBackSince(writtenBefore)
	f.Reuse = s.sb.Stats().RefreshReuse - reuseBefore
	f.Webhooks = s.hooks.count("connection.rolled_back")
	f.Reauth = s.regrant(ctx)
	fault.end = time.Now()
	s.calls.mu.Lock()
	for _, c := range s.calls.bad {
		if c.end.After(f.start) && c.start.Before(fault.end) {
			f.Failed++
		}
	}
	s.calls.mu.Unlock()
	fault.For = fault.end.Sub(f.start).Round(100 * time.Millisecond).String()
	s.faults.add(fault)
	lost := 0
	for _, n := range f.Lost {
		lost += int(n)
	}
	f.Kept = max(f.Committed-lost, 0)
	s.say("%7s  %-21s committed %d rotations, kept %d; lost %v; written back %v; regressions detected %v; provider reuse %d; needs_reauth %v; calls failed %d, recovered after %s",
		fmtOffset(s.since(time.Now())), "  measured", f.Committed, f.Kept, f.Lost, f.WrittenBack, f.Detected, f.Reuse, f.Reauth, f.Failed, f.Recovery)
	return f
}

func parseDur(s string) time.Duration {
	d, _ := time.ParseDuration(s)
	return d
}

// versionsCommittedSince counts the rotations the apps logged stored
// since the count was before.
func (s *soak) versionsCommittedSince(before int) int {
	_, now, _ := s.versions.snapshot()
	return now - before
}

// standbyVersions reads each connection's version on the standby as the
// old primary left it (it is still in recovery: read-only).
func (s *soak) standbyVersions(ctx context.Context, adminURL string) map[string]int64 {
	out := map[string]int64{}
	u, err := url.Parse(adminURL)
	if err != nil {
		return out
	}
	u.Path = "/" + s.dbName
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, u.String())
	if err != nil {
		s.say("  standby not readable: %v", err)
		return out
	}
	defer c.Close(context.WithoutCancel(ctx))
	// What it received is what promotion keeps: read once it is applied.
	for i := 0; i < 100; i++ {
		var applied bool
		err := c.QueryRow(ctx, `SELECT pg_last_wal_replay_lsn() >= pg_last_wal_receive_lsn()`).Scan(&applied)
		if err != nil || applied {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	rows, err := c.Query(ctx, `SELECT c.name, t.version FROM tokenguard_tokens t JOIN tokenguard_connections c ON c.id = t.connection_id`)
	if err != nil {
		return out
	}
	for rows.Next() {
		var name string
		var v int64
		if rows.Scan(&name, &v) == nil {
			out[name] = v
		}
	}
	rows.Close()
	return out
}

// regrant gives the connections marked needs_reauth a new grant
// (tokenctl import), so that the next failover finds every connection
// live, and returns them with their reasons.
func (s *soak) regrant(ctx context.Context) []string {
	var dead []string
	_ = s.query(ctx, func(ctx context.Context, c *pgx.Conn) error {
		rows, err := c.Query(ctx, `SELECT c.name, t.status_reason FROM tokenguard_connections c JOIN tokenguard_tokens t ON t.connection_id = c.id WHERE t.status = 'needs_reauth' ORDER BY 1`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var name, reason string
			if rows.Scan(&name, &reason) == nil {
				dead = append(dead, name+": "+reason)
			}
		}
		return rows.Err()
	})
	for _, d := range dead {
		name, _, _ := strings.Cut(d, ":")
		if err := s.importGrant(ctx, name); err != nil {
			s.say("  re-grant %s: %v", name, err)
		}
	}
	s.checks.mu.Lock()
	for _, d := range dead {
		name, reason, _ := strings.Cut(d, ": ")
		if s.checks.regranted == nil {
			s.checks.regranted = map[string][]string{}
		}
		s.checks.regranted[name] = append(s.checks.regranted[name], reason)
		delete(s.checks.needsReauth, name)
	}
	s.checks.mu.Unlock()
	return dead
}

// failoverInvariants are the failover soak's rows of the table.
func (s *soak) failoverInvariants(rep *Report, inv func(name string, ok bool, format string, a ...any)) {
	s.fo.mu.Lock()
	rep.Failovers = append([]*Failover(nil), s.fo.all...)
	s.fo.mu.Unlock()
	// A lost rotation is written back by the process that stored it, or
	// reported by one that knew it; only a reported loss that was not
	// written back leaves the spent refresh token to be presented.
	var lost, lostConns, detected, unrepaired, written, reauth int
	var reuse int64
	var rolledBack int
	silent := []string{}
	for _, f := range rep.Failovers {
		for _, n := range f.Lost {
			lost += int(n)
		}
		lostConns += len(f.Lost)
		detected += len(f.Detected)
		written += len(f.WrittenBack)
		reuse += f.Reuse
		reauth += len(f.Reauth)
		seen := map[string]bool{}
		for _, c := range f.WrittenBack {
			seen[c] = true
		}
		for _, d := range f.Detected {
			if c := strings.Fields(d)[0]; !seen[c] {
				seen[c] = true
				unrepaired++
			}
		}
		for name := range f.Lost {
			if !seen[name] {
				silent = append(silent, f.At+" "+name)
			}
		}
		for _, r := range f.Reauth {
			if strings.HasSuffix(r, ": "+"rolled_back") {
				rolledBack++
			}
		}
	}
	rep.RolledBackWebhooks = s.hooks.count("connection.rolled_back")
	sort.Strings(silent)
	inv("failovers done", len(rep.Failovers) == s.o.Failovers, "%d of %d", len(rep.Failovers), s.o.Failovers)
	if s.o.Failover == FailoverSync {
		inv("rotations lost (committed, not on the promoted standby)", lost == 0, "%d", lost)
		inv("version regressions detected", detected == 0, "%d", detected)
		inv("needs_reauth after a failover", reauth == 0, "%d", reauth)
		return
	}
	inv("lost rotations written back or reported (connections with a loss)", len(silent) == 0,
		"%d lost versions on %d connections; %d written back, %d regressions reported; silent: %d%s",
		lost, lostConns, written, detected, len(silent), list(silent))
	inv("provider reuse = reported losses not written back", reuse == int64(unrepaired), "reuse %d, reported and not written back %d", reuse, unrepaired)
	inv("connection.rolled_back webhooks delivered", rep.RolledBackWebhooks >= unrepaired,
		"%d distinct events for %d losses not written back", rep.RolledBackWebhooks, unrepaired)
	inv("needs_reauth only after a reported loss not written back", reauth <= unrepaired,
		"%d needs_reauth (%d with reason rolled_back), %d reported and not written back", reauth, rolledBack, unrepaired)
}

// printFailovers writes the per-failover table.
func (rep *Report) printFailovers(w io.Writer) {
	if len(rep.Failovers) == 0 {
		return
	}
	fmt.Fprintf(w, "\nFailovers (%s standby)\n| at | during a refresh | isolated | promoted | rebuilt | calls failed | recovery | rotations committed | kept | written back | regressions detected | provider reuse | needs_reauth |\n", rep.FailoverMode)
	for _, f := range rep.Failovers {
		fmt.Fprintf(w, "| %s | %v | %s | %s | %s | %d | %s | %d | %d | %d%s | %d%s | %d | %d%s |\n", f.At, f.DuringRef, f.Isolated, f.Promoted, f.Rebuilt,
			f.Failed, f.Recovery, f.Committed, f.Kept, len(f.WrittenBack), list(f.WrittenBack), len(f.Detected), list(f.Detected), f.Reuse, len(f.Reauth), list(f.Reauth))
	}
}
