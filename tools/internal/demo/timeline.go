package demo

import (
	"bufio"
	"cmp"
	"encoding/json"
	"io"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/tokenguard/tokenguard/internal/sandbox"
)

// Timeline is what happened during a run, second by second, for the HTML
// report (and report.json). It holds no token.
type Timeline struct {
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	// Lanes are the app processes, in display order.
	Lanes []Lane `json:"lanes"`
	// Refreshes are the refreshes the apps logged ("token refresh",
	// outcome ok), in time order.
	Refreshes []RefreshMark `json:"refreshes"`
	// Tokens are the lifetimes of every access token, per connection.
	Tokens []TokenBand `json:"tokens"`
}

// Lane is one app process and what it did each second.
type Lane struct {
	App     string   `json:"app"`
	PID     int      `json:"pid"`
	Seconds []Second `json:"seconds"`
}

// Second counts one app's calls to the external API in one second.
type Second struct {
	At           time.Time `json:"at"`
	OK           int64     `json:"ok"`           // accepted by the provider
	Unauthorized int64     `json:"unauthorized"` // answered 401 (then retried with a newer token)
	Failed       int64     `json:"failed"`       // failures the app's users saw
}

// RefreshMark is one refresh, as the app that did it logged it.
type RefreshMark struct {
	At         time.Time `json:"at"`
	App        string    `json:"app"`
	PID        int       `json:"pid"`
	Connection string    `json:"connection"`
	Version    int64     `json:"version"` // the version stored
	LockWaitMS float64   `json:"lock_wait_ms"`
	ProviderMS float64   `json:"provider_ms"`
	Forced     bool      `json:"forced"`
}

// TokenBand is one access token's life: from when it was obtained to its
// expiry, and when the next one replaced it.
type TokenBand struct {
	Connection string    `json:"connection"`
	Version    int64     `json:"version"`
	From       time.Time `json:"from"`
	Expiry     time.Time `json:"expiry"`
	Replaced   time.Time `json:"replaced,omitzero"`
}

// ParseRefreshLog reads an app's JSON log (LOG_FORMAT=json) and returns
// its successful refreshes. Lines that are not JSON or not refreshes are
// skipped.
func ParseRefreshLog(r io.Reader) ([]RefreshMark, error) {
	var out []RefreshMark
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var l struct {
			Time       time.Time `json:"time"`
			Msg        string    `json:"msg"`
			App        string    `json:"app"`
			PID        int       `json:"pid"`
			Connection string    `json:"connection"`
			Outcome    string    `json:"outcome"`
			NewVersion int64     `json:"new_version"`
			LockWaitMS float64   `json:"lock_wait_ms"`
			ProviderMS float64   `json:"provider_ms"`
			Forced     bool      `json:"forced"`
		}
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.Msg != "token refresh" || l.Outcome != "ok" {
			continue
		}
		out = append(out, RefreshMark{At: l.Time, App: l.App, PID: l.PID, Connection: l.Connection, Version: l.NewVersion,
			LockWaitMS: l.LockWaitMS, ProviderMS: l.ProviderMS, Forced: l.Forced})
	}
	return out, sc.Err()
}

// TokenBands derives each connection's token lifetimes from when it was
// first granted (version 1) and the refreshes after; lifetime is how long
// its provider's access tokens live, per connection.
func TokenBands(granted map[string]time.Time, marks []RefreshMark, lifetimes map[string]time.Duration) []TokenBand {
	var out []TokenBand
	for _, name := range slices.Sorted(maps.Keys(granted)) {
		lifetime := lifetimes[name]
		cur := TokenBand{Connection: name, Version: 1, From: granted[name], Expiry: granted[name].Add(lifetime)}
		for _, m := range marks {
			if m.Connection != name {
				continue
			}
			cur.Replaced = m.At
			out = append(out, cur)
			cur = TokenBand{Connection: name, Version: m.Version, From: m.At, Expiry: m.At.Add(lifetime)}
		}
		out = append(out, cur)
	}
	return out
}

// failures records, per app and second, the failures the demo's users saw.
type failures struct {
	mu sync.Mutex
	n  map[string]map[int64]int64
}

func (f *failures) add(app string, at time.Time, n int64) {
	if n <= 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == nil {
		f.n = map[string]map[int64]int64{}
	}
	if f.n[app] == nil {
		f.n[app] = map[int64]int64{}
	}
	f.n[app][at.Unix()] += n
}

// lanes merges the provider's per-second counts with the failures seen.
func (f *failures) lanes(apps []string, pids map[string]int, res []sandbox.ResourceSecond) []Lane {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Lane
	for _, app := range apps {
		secs := map[int64]*Second{}
		get := func(unix int64) *Second {
			if secs[unix] == nil {
				secs[unix] = &Second{At: time.Unix(unix, 0).UTC()}
			}
			return secs[unix]
		}
		for _, r := range res {
			if r.Agent == "tokenguard-"+app {
				s := get(r.Second.Unix())
				s.OK += r.OK
				s.Unauthorized += r.Unauthorized
			}
		}
		for unix, n := range f.n[app] {
			get(unix).Failed += n
		}
		l := Lane{App: app, PID: pids[app]}
		for _, s := range secs {
			l.Seconds = append(l.Seconds, *s)
		}
		slices.SortFunc(l.Seconds, func(a, b Second) int { return a.At.Compare(b.At) })
		out = append(out, l)
	}
	return out
}

func sortMarks(m []RefreshMark) {
	slices.SortStableFunc(m, func(a, b RefreshMark) int { return cmp.Or(a.At.Compare(b.At), cmp.Compare(a.Version, b.Version)) })
}
