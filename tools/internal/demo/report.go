package demo

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"
)

// ExpectedRefreshes is how many refreshes a connection whose token was
// granted at granted needs while it is in continuous use from from to to,
// when each token is refreshed cycle (lifetime minus skew) after it was
// obtained: the first at granted+cycle (or at from, if the token was
// already stale then), then one every cycle.
func ExpectedRefreshes(granted, from, to time.Time, cycle time.Duration) int {
	if cycle <= 0 || !to.After(from) {
		return 0
	}
	first := granted.Add(cycle)
	if first.Before(from) {
		first = from
	}
	if first.After(to) {
		return 0
	}
	return 1 + int(to.Sub(first)/cycle)
}

// AppReport is what one app did, as the demo saw it.
type AppReport struct {
	Calls    int64  `json:"calls"`    // calls to the external API the app made successfully, counted by the provider
	Failures int64  `json:"failures"` // failures the app's users saw
	Detail   string `json:"detail"`
}

// Report is the demo's result, also written as JSON.
type Report struct {
	StartedAt       time.Time            `json:"started_at"`
	DurationSeconds float64              `json:"duration_seconds"`
	RefreshSkew     float64              `json:"refresh_skew_seconds"`
	Database        string               `json:"database"`
	Connections     []string             `json:"connections"`
	Apps            map[string]AppReport `json:"apps"`
	Events          EventReport          `json:"events"`
	// Providers: the OAUTH_* one first, then the stored one.
	Providers   []ProviderReport   `json:"providers"`
	Shutdown    map[string]Stopped `json:"shutdown"`
	Interrupted bool               `json:"interrupted"`
	Problems    []string           `json:"problems"`
	OK          bool               `json:"ok"`
	// Timeline is the run second by second (the HTML report's picture).
	Timeline *Timeline `json:"timeline,omitempty"`
}

// EventReport follows the events the demo enqueued.
type EventReport struct {
	Enqueued  int64 `json:"enqueued"`
	Processed int64 `json:"processed"` // completed by the worker
	Retried   int64 `json:"retried"`   // failed attempts that were retried
	Lost      int64 `json:"lost"`      // enqueued but never completed
	// Unfinished: not processed yet when the run was interrupted (they
	// are not failures; the database is dropped with them).
	Unfinished int64 `json:"unfinished"`
}

// ProviderReport is what one sandbox provider saw.
type ProviderReport struct {
	// Name is the stored provider's name (tokenctl provider add); "" is
	// the provider of the OAUTH_* settings.
	Name                string   `json:"name"`
	URL                 string   `json:"url"`
	Quirks              string   `json:"quirks"`
	AccessTokenLifetime float64  `json:"access_token_lifetime_seconds"`
	Connections         []string `json:"connections"`
	Refreshes           int64    `json:"refreshes"`
	ExpectedRefreshes   int      `json:"expected_refreshes"`
	RefreshReuse        int64    `json:"refresh_token_reuse"`
	// RefreshRejected counts refresh requests answered with an error,
	// reuse included (auth style auto's HTTP Basic probe at a provider
	// that takes only the form body is one).
	RefreshRejected int64            `json:"refresh_rejected"`
	Resource401     int64            `json:"resource_401"`
	ResourceOK      int64            `json:"resource_ok"`
	ByAgent         map[string]int64 `json:"resource_ok_by_user_agent"`
	// RefreshesByApp counts the refreshes it granted, by the app's
	// User-Agent.
	RefreshesByApp map[string]int `json:"refreshes_by_app"`
	CodeExchanges  int64          `json:"code_exchanges"`
	// Notes explain what the figures alone do not.
	Notes []string `json:"notes,omitempty"`
}

// problems are what makes the run fail at this provider: any
// refresh-token reuse, or no refresh where the run needed some.
func (p ProviderReport) problems() []string {
	var out []string
	if p.RefreshReuse > 0 {
		out = append(out, fmt.Sprintf("provider %s saw %d refresh-token reuse", p.Title(), p.RefreshReuse))
	}
	if p.Refreshes == 0 && p.ExpectedRefreshes > 0 {
		out = append(out, fmt.Sprintf("provider %s saw no refresh (expected %d)", p.Title(), p.ExpectedRefreshes))
	}
	return out
}

// Title is how the report names the provider.
func (p ProviderReport) Title() string {
	if p.Name == "" {
		return "OAUTH_*"
	}
	return p.Name
}

// PrintTable writes the final table.
func (r *Report) PrintTable(w io.Writer) {
	fmt.Fprintf(w, "\ntokenguard demo: %.0fs, %d connections at %d providers, access tokens refreshed %s early\n\n",
		r.DurationSeconds, len(r.Connections), len(r.Providers), secs(r.RefreshSkew))
	fmt.Fprintf(w, "  %-7s %9s %9s\n", "app", "API calls", "failures")
	for _, name := range []string{"server", "worker", "batch"} {
		a := r.Apps[name]
		fmt.Fprintf(w, "  %-7s %9d %9d   %s\n", name, a.Calls, a.Failures, a.Detail)
	}
	nameW, quirkW, connW := len("provider"), 0, len("connections")
	for _, p := range r.Providers {
		nameW, quirkW, connW = max(nameW, len(p.Title())), max(quirkW, len(p.Quirks)), max(connW, len(strings.Join(p.Connections, ", ")))
	}
	fmt.Fprintf(w, "\n  %-*s  %-*s  %-*s  %9s  %8s  %5s  %5s\n", nameW, "provider", quirkW, "", connW, "connections", "refreshes", "expected", "reuse", "401")
	for _, p := range r.Providers {
		fmt.Fprintf(w, "  %-*s  %-*s  %-*s  %9d  %8d  %5d  %5d\n", nameW, p.Title(), quirkW, p.Quirks, connW, strings.Join(p.Connections, ", "),
			p.Refreshes, p.ExpectedRefreshes, p.RefreshReuse, p.Resource401)
	}
	for _, p := range r.Providers {
		for _, n := range p.Notes {
			fmt.Fprintf(w, "  %s: %s\n", p.Title(), n)
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "events:   %d enqueued, %d processed, %d retried, %d lost",
		r.Events.Enqueued, r.Events.Processed, r.Events.Retried, r.Events.Lost)
	if r.Events.Unfinished > 0 {
		fmt.Fprintf(w, ", %d unfinished (interrupted)", r.Events.Unfinished)
	}
	fmt.Fprintln(w)
	var stops []string
	for _, name := range []string{"server", "worker", "batch"} {
		if s, ok := r.Shutdown[name]; ok {
			stops = append(stops, fmt.Sprintf("%s exit %d in %.1fs", name, s.ExitCode, s.Seconds))
		}
	}
	fmt.Fprintf(w, "SIGTERM:  %s\n", strings.Join(stops, ", "))
	if r.OK {
		fmt.Fprintln(w, "\nPASS: no failed call, no refresh-token reuse at any provider")
		return
	}
	fmt.Fprintln(w, "\nFAIL:")
	for _, p := range r.Problems {
		fmt.Fprintln(w, "  - "+p)
	}
}

func secs(s float64) string { return (time.Duration(s * float64(time.Second))).String() }

// RunAndReport runs the demo, prints its table to out and writes
// report.json and report.html under o.OutDir. ok is false when a call
// failed or a refresh token was reused.
func RunAndReport(ctx context.Context, o Options, out io.Writer) (ok bool, err error) {
	rep, err := Run(ctx, o, out)
	if err != nil {
		return false, err
	}
	rep.PrintTable(out)
	path := filepath.Join(o.OutDir, "report.json")
	if err := rep.WriteJSON(path); err != nil {
		return false, err
	}
	page := filepath.Join(o.OutDir, "report.html")
	if err := rep.WriteHTMLFile(page); err != nil {
		return false, err
	}
	fmt.Fprintln(out, "report:", path, "and", page)
	return rep.OK, nil
}
