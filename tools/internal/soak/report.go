package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokenguard/tokenguard/internal/sandbox"
)

// Report is the soak's result, also written as report.json.
type Report struct {
	StartedAt     time.Time   `json:"started_at"`
	Duration      string      `json:"duration"`
	TokenLifetime string      `json:"token_lifetime"`
	Seed          uint64      `json:"seed"`
	Control       bool        `json:"control"`
	Interrupted   bool        `json:"interrupted"`
	Invariants    []Invariant `json:"invariants"`
	Restarts      []Restart   `json:"postgres_restarts"`
	// FailedByFault counts failed calls by the fault whose window they
	// fall in (a call in several windows counts for the first).
	FailedByFault map[string]int `json:"failed_by_fault"`
	Unexplained   []string       `json:"unexplained_failures"`
	// WindowShare is the share of the fault phase inside a fault window.
	WindowShare   float64          `json:"window_share"`
	Calls         map[string]int64 `json:"calls_ok"`
	Provider      sandbox.Stats    `json:"provider"`
	Events        EventCounts      `json:"events"`
	Hastened      int64            `json:"events_retry_hastened"`
	NotPersisted  []LogEntry       `json:"rotated_not_persisted"`
	Retried       []LogEntry       `json:"rotated_persisted_on_retry"`
	Dropped       []LogEntry       `json:"rotated_dropped"`
	KillsDeferred int              `json:"kills_deferred"`
	Faults        []*Fault         `json:"faults"`
	// The failover soak (Options.Failover): its mode, each failover, and
	// the connection.rolled_back events the webhook receiver got.
	FailoverMode       string      `json:"failover_mode,omitempty"`
	Failovers          []*Failover `json:"failovers,omitempty"`
	RolledBackWebhooks int         `json:"rolled_back_webhooks,omitempty"`
	Problems           []string    `json:"problems"`
	OK                 bool        `json:"ok"`
}

// Invariant is one row of the table.
type Invariant struct {
	Name  string `json:"name"`
	Value string `json:"value"`
	OK    bool   `json:"ok"`
}

// Restart is one Postgres restart and how the apps came back.
type Restart struct {
	At       string `json:"at"`
	Down     string `json:"down"`     // restart sent until Postgres answered again
	Recovery string `json:"recovery"` // Postgres answering until a resource call, an enqueue and a batch round all succeeded
	Failed   int    `json:"failed"`   // calls failed in the window
	down     time.Duration
	recovery time.Duration
}

// EventCounts follows the events the server accepted.
type EventCounts struct {
	Accepted  int64            `json:"accepted"`
	Processed int64            `json:"processed"`
	Attempts  int64            `json:"attempts"` // worker attempts in all (retries included)
	Missing   map[string]int64 `json:"missing_by_state,omitempty"`
}

// slack is how long after a fault's end failures still count as its
// doing: a token that expired during a provider outage is refreshed at
// the next call, a restarted server takes its first requests.
const slack = 5 * time.Second

func (s *soak) finish(ctx context.Context, rep *Report, faultEnd time.Time) {
	ctx = context.WithoutCancel(ctx)
	rep.Provider = s.sb.Stats()
	rep.Faults = s.faults.list()
	s.gate.mu.Lock()
	rep.KillsDeferred = s.gate.deferred
	s.gate.mu.Unlock()
	s.logs.mu.Lock()
	rep.NotPersisted, rep.Retried, rep.Dropped = s.logs.notPersisted, s.logs.retried, s.logs.dropped
	s.logs.mu.Unlock()
	s.calls.mu.Lock()
	rep.Calls = s.calls.ok
	bad := append([]call(nil), s.calls.bad...)
	s.calls.mu.Unlock()

	// Events: every accepted one completed, by id.
	ids := s.events.ids()
	rep.Events.Accepted = int64(len(ids))
	err := s.query(ctx, func(ctx context.Context, c *pgx.Conn) error {
		rows, err := c.Query(ctx, `SELECT state, count(*), coalesce(sum(attempt), 0) FROM river_job WHERE id = ANY($1) GROUP BY state`, ids)
		if err != nil {
			return err
		}
		defer rows.Close()
		seen := int64(0)
		for rows.Next() {
			var state string
			var n, attempts int64
			if err := rows.Scan(&state, &n, &attempts); err != nil {
				return err
			}
			seen += n
			rep.Events.Attempts += attempts
			if state == "completed" {
				rep.Events.Processed = n
			} else {
				if rep.Events.Missing == nil {
					rep.Events.Missing = map[string]int64{}
				}
				rep.Events.Missing[state] = n
			}
		}
		if gone := rep.Events.Accepted - seen; gone > 0 {
			if rep.Events.Missing == nil {
				rep.Events.Missing = map[string]int64{}
			}
			rep.Events.Missing["not in river_job"] = gone
		}
		return rows.Err()
	})
	if err != nil {
		rep.Problems = append(rep.Problems, "reading river_job: "+err.Error())
	}

	// Rotations: every one the provider made is stored or logged as lost.
	var stored int64
	if err := s.query(ctx, func(ctx context.Context, c *pgx.Conn) error {
		return c.QueryRow(ctx, `SELECT count(*) FROM soak_rotations`).Scan(&stored)
	}); err != nil {
		rep.Problems = append(rep.Problems, "reading soak_rotations: "+err.Error())
	}

	// Failed calls: each inside some fault's window, Postgres restarts first.
	restarts, windows := s.windows(rep.Faults, bad)
	rep.Restarts = restarts
	rep.FailedByFault = map[string]int{}
	s.checks.mu.Lock()
	reauthSeen := len(s.checks.needsReauth) > 0
	s.checks.mu.Unlock()
	for _, c := range bad {
		if reauthSeen && strings.Contains(c.err, `"code":"needs_reauth"`) {
			// Answered for a connection marked needs_reauth: that
			// invariant has failed already, and says when.
			rep.FailedByFault["needs_reauth"]++
			continue
		}
		kind := ""
		for _, w := range windows {
			if w.holds(c) {
				kind = w.kind
				break
			}
		}
		if kind == "" {
			rep.Unexplained = append(rep.Unexplained, fmt.Sprintf("%s %s: %s", fmtOffset(s.since(c.start)), c.kind, c.err))
			continue
		}
		rep.FailedByFault[kind]++
	}
	var downs, recoveries []time.Duration
	recovered := true
	for _, r := range restarts {
		downs = append(downs, r.down)
		if r.recovery < 0 {
			recovered = false
			continue
		}
		recoveries = append(recoveries, r.recovery)
	}

	s.checks.mu.Lock()
	var reauth []string
	for name, at := range s.checks.needsReauth {
		reauth = append(reauth, name+" at "+at)
	}
	s.checks.mu.Unlock()
	sort.Strings(reauth)
	// A new grant given after a needs_reauth (failover soak) replaces the
	// refresh token too, without a rotation.
	regrants := int64(0)
	s.checks.mu.Lock()
	for _, rs := range s.checks.regranted {
		regrants += int64(len(rs))
	}
	s.checks.mu.Unlock()
	stored -= regrants
	unaccounted := rep.Provider.Refreshes - stored - int64(len(rep.Dropped))

	inv := func(name string, ok bool, format string, a ...any) {
		rep.Invariants = append(rep.Invariants, Invariant{Name: name, Value: fmt.Sprintf(format, a...), OK: ok})
	}
	async := s.o.Failover == FailoverAsync
	if !async { // there, each lost rotation is a reuse: the failover rows count them
		inv("refresh-token reuse (provider)", rep.Provider.RefreshReuse == 0, "%d", rep.Provider.RefreshReuse)
		inv("connections wrongly marked needs_reauth", len(reauth) == 0, "%d%s", len(reauth), list(reauth))
	}
	exempt := ""
	if n := s.events.exempted(); n > 0 {
		exempt = fmt.Sprintf("; %d accepted around a failover to the asynchronous standby left out", n)
	}
	inv("accepted events processed (by id, River job completed)", rep.Events.Processed == rep.Events.Accepted && rep.Events.Accepted > 0,
		"%d/%d (%d attempts)%s", rep.Events.Processed, rep.Events.Accepted, rep.Events.Attempts, exempt)
	lostInFailovers := int64(0)
	s.fo.mu.Lock()
	for _, f := range s.fo.all {
		for name, n := range f.Lost {
			if slices.Contains(f.WrittenBack, name) {
				n-- // written back as one version, over the first it lost
			}
			lostInFailovers += n
		}
	}
	s.fo.mu.Unlock()
	inv("rotated tokens stored or logged lost", unaccounted == lostInFailovers,
		"%d rotations = %d stored + %d dropped (logged) + %d lost in failovers (not written back); %d unaccounted; %d persisted on retry",
		rep.Provider.Refreshes, stored, len(rep.Dropped), lostInFailovers, unaccounted-lostInFailovers, len(rep.Retried))
	rep.WindowShare = coverage(windows, s.start, faultEnd)
	inv("failed calls outside fault windows", len(rep.Unexplained) == 0, "%d of %d failed calls (windows cover %.0f%% of the run)",
		len(rep.Unexplained), len(bad), rep.WindowShare*100)
	if s.o.Failover != "" {
		s.failoverInvariants(rep, inv)
	} else {
		s.dpopInvariant(ctx, rep)
		// The first fault drawn is a restart (inject).
		inv("Postgres restarts: down / recovery p50, p99", recovered && (len(restarts) > 0 || s.o.Duration < 30*time.Second),
			"%d restarts; down %s, %s; recovery %s, %s", len(restarts),
			round(percentile(downs, 0.5)), round(percentile(downs, 0.99)), round(percentile(recoveries, 0.5)), round(percentile(recoveries, 0.99)))
	}
	rep.OK = true
	for _, i := range rep.Invariants {
		rep.OK = rep.OK && i.OK
	}
}

func list(xs []string) string {
	if len(xs) == 0 {
		return ""
	}
	return " (" + strings.Join(xs, "; ") + ")"
}

func round(d time.Duration) string { return d.Round(10 * time.Millisecond).String() }

type window struct {
	kind     string
	calls    string // only calls of this kind ("": all)
	from, to time.Time
}

func (w window) holds(c call) bool {
	return (w.calls == "" || w.calls == c.kind) && c.end.After(w.from) && c.start.Before(w.to)
}

// windows returns each Postgres restart with its recovery, and every
// fault's window, restarts first. After a restart each kind of call
// (resource, event, batch round) is in the window until one of its kind
// started after Postgres answered again succeeded: the restart's recovery
// is the longest of the three. Other faults' windows last until slack
// after they ended, a kill's that may have left a lease behind for the
// lost answer's recovery more.
func (s *soak) windows(faults []*Fault, bad []call) ([]Restart, []window) {
	var restarts []Restart
	var first, rest []window
	for _, f := range faults {
		if f.Kind != fPGRestart {
			to := f.end.Add(slack)
			if f.leaseMayLinger {
				to = to.Add(lostAnswerRecovery)
			}
			rest = append(rest, window{kind: f.Kind, from: f.start, to: to})
			continue
		}
		if f.ready.IsZero() {
			f.ready = f.end // the restart failed; the run fails on it anyway
		}
		r := Restart{At: f.At, Down: round(f.down), down: f.down}
		var ws []window
		for _, kind := range []string{"resource", "event", "batch"} {
			ok, found := s.calls.firstOKAfter(kind, f.ready)
			if !found {
				r.Recovery, r.recovery = "never", -1
				ok = f.ready.Add(slack)
			} else if r.recovery >= 0 {
				r.recovery = max(r.recovery, ok.Sub(f.ready))
			}
			ws = append(ws, window{kind: f.Kind, calls: kind, from: f.start, to: ok})
		}
		if r.recovery >= 0 {
			r.Recovery = round(r.recovery)
		}
		for _, c := range bad {
			for _, w := range ws {
				if w.holds(c) {
					r.Failed++
					break
				}
			}
		}
		restarts = append(restarts, r)
		first = append(first, ws...)
	}
	// The faults on the apps' side come before the provider's, which
	// overlap them for seconds at a time.
	sort.SliceStable(rest, func(i, j int) bool {
		return !strings.HasPrefix(rest[i].kind, providerPrefix) && strings.HasPrefix(rest[j].kind, providerPrefix)
	})
	return restarts, append(first, rest...)
}

// coverage is the share of [from, to] inside some window.
func coverage(ws []window, from, to time.Time) float64 {
	if !to.After(from) {
		return 0
	}
	ws = append([]window(nil), ws...)
	sort.Slice(ws, func(i, j int) bool { return ws[i].from.Before(ws[j].from) })
	var covered time.Duration
	cur := from
	for _, w := range ws {
		a, b := maxTime(w.from, cur), minTime(w.to, to)
		if b.After(a) {
			covered += b.Sub(a)
			cur = b
		}
	}
	return covered.Seconds() / to.Sub(from).Seconds()
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// Print writes the report as tables.
func (rep *Report) Print(w io.Writer) {
	control := ""
	if rep.Control {
		control = ", CONTROL run"
	}
	fmt.Fprintf(w, "\nInvariants (seed %d, %s, tokens live %s%s)\n", rep.Seed, rep.Duration, rep.TokenLifetime, control)
	fmt.Fprintf(w, "| %-55s | %-4s | %s\n", "invariant", "ok", "value")
	for _, i := range rep.Invariants {
		ok := "yes"
		if !i.OK {
			ok = "NO"
		}
		fmt.Fprintf(w, "| %-55s | %-4s | %s\n", i.Name, ok, i.Value)
	}
	rep.printFailovers(w)
	if rep.FailoverMode == "" {
		fmt.Fprintf(w, "\nPostgres restarts\n| at | down | recovery | failed calls |\n")
		for _, r := range rep.Restarts {
			fmt.Fprintf(w, "| %s | %s | %s | %d |\n", r.At, r.Down, r.Recovery, r.Failed)
		}
	}
	kinds := make([]string, 0, len(rep.FailedByFault))
	for k := range rep.FailedByFault {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	fmt.Fprintf(w, "\nFailed calls by fault window:")
	for _, k := range kinds {
		fmt.Fprintf(w, " %s %d;", k, rep.FailedByFault[k])
	}
	fmt.Fprintf(w, " outside any: %d\n", len(rep.Unexplained))
	for i, u := range rep.Unexplained {
		if i == 20 {
			fmt.Fprintf(w, "  … %d more in report.json\n", len(rep.Unexplained)-20)
			break
		}
		fmt.Fprintf(w, "  %s\n", u)
	}
	fmt.Fprintf(w, "Calls answered: %d resource, %d events accepted, %d batch rounds ok; provider: %d refreshes, %d rejected (%d injected faults), %d resource 401\n",
		rep.Calls["resource"], rep.Calls["event"], rep.Calls["batch"], rep.Provider.Refreshes, rep.Provider.RefreshRejected, rep.Provider.RefreshFaults, rep.Provider.Resource401)
	if rep.Hastened > 0 {
		fmt.Fprintf(w, "Events waiting for a retry made due at the end: %d\n", rep.Hastened)
	}
	if len(rep.Events.Missing) > 0 {
		fmt.Fprintf(w, "Events not processed, by state: %v\n", rep.Events.Missing)
	}
	fmt.Fprintf(w, "Rotation window: %d writes retried (logged %q), %d persisted on retry, %d dropped; %d kills put off until the target left its window\n",
		len(rep.NotPersisted), msgNotPersisted, len(rep.Retried), len(rep.Dropped), rep.KillsDeferred)
	for _, e := range append(append([]LogEntry(nil), rep.Retried...), rep.Dropped...) {
		fmt.Fprintf(w, "  %s %s %s %s\n", e.At, e.App, e.Connection, e.Err)
	}
	fmt.Fprintf(w, "\nFaults injected (%d)\n| at | fault | what | lasted |\n", len(rep.Faults))
	for _, f := range rep.Faults {
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", f.At, f.Kind, f.Detail, f.For)
	}
	for _, p := range rep.Problems {
		fmt.Fprintf(w, "problem: %s\n", p)
	}
	if rep.OK {
		fmt.Fprintln(w, "\nsoak: every invariant held")
	} else {
		fmt.Fprintln(w, "\nsoak: FAILED")
	}
}

func (rep *Report) writeJSON(path string) error {
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(js, '\n'), 0o644)
}
