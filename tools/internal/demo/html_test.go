package demo

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"
)

func syntheticReport() *Report {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	marks := []RefreshMark{
		{At: at(2000), App: "server", PID: 101, Connection: "acme", Version: 2, LockWaitMS: 3, ProviderMS: 5},
		{At: at(2100), App: "worker", PID: 102, Connection: "globex", Version: 2},
		{At: at(4000), App: "batch", PID: 103, Connection: "acme", Version: 3, Forced: true},
		{At: at(4150), App: "server", PID: 101, Connection: "globex", Version: 3},
		{At: at(4500), App: "worker", PID: 102, Connection: "initech", Version: 2, Forced: true},
	}
	granted := map[string]time.Time{"acme": t0, "globex": at(100), "initech": at(200)}
	lanes := []Lane{
		{App: "server", PID: 101, Seconds: []Second{{At: at(0), OK: 300}, {At: at(1000), OK: 320}, {At: at(2000), OK: 290, Unauthorized: 2}}},
		{App: "worker", PID: 102, Seconds: []Second{{At: at(0), OK: 20}, {At: at(3000), OK: 19, Failed: 1}}},
		{App: "batch", PID: 103, Seconds: []Second{{At: at(1000), OK: 2}}},
	}
	return &Report{
		DurationSeconds: 5, RefreshSkew: 1, Connections: []string{"acme", "globex", "initech"},
		Apps: map[string]AppReport{"server": {Calls: 910, Detail: "910 requests answered 200"}, "worker": {Calls: 39, Failures: 1}, "batch": {Calls: 2}},
		Providers: []ProviderReport{
			{Quirks: "HTTP Basic only, expires_in 3", AccessTokenLifetime: 3, Connections: []string{"acme", "globex"},
				Refreshes: 4, ExpectedRefreshes: 4, RefreshesByApp: map[string]int{"server": 2, "worker": 1, "batch": 1}},
			{Name: "sandbox-form", Quirks: "form body only, no expires_in (tokens live 4s)", AccessTokenLifetime: 4, Connections: []string{"initech"},
				Refreshes: 1, ExpectedRefreshes: 1, RefreshRejected: 1, Resource401: 2, RefreshesByApp: map[string]int{"worker": 1},
				Notes: []string{"2 × 401: the imported first token said no expiry"}},
		},
		Problems: []string{"worker: 1 failed calls (see demo-out/worker.log)"},
		Timeline: &Timeline{
			Start: t0, End: at(5000), Lanes: lanes, Refreshes: marks,
			Tokens: TokenBands(granted, marks, map[string]time.Duration{"acme": 3 * time.Second, "globex": 3 * time.Second, "initech": 4 * time.Second}),
		},
	}
}

func TestHTMLReportIsSelfContained(t *testing.T) {
	var buf bytes.Buffer
	if err := syntheticReport().WriteHTML(&buf); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	if !strings.Contains(page, "<svg") || !strings.Contains(page, "</html>") {
		t.Fatal("no picture")
	}
	// Nothing is fetched: no external src or href, no script, no @import.
	if m := regexp.MustCompile(`(?i)(src|href)\s*=\s*["']?\s*(https?:)?//`).FindString(page); m != "" {
		t.Errorf("external reference %q", m)
	}
	for _, bad := range []string{"<script", "@import", "url(", "<link", "<img"} {
		if strings.Contains(strings.ToLower(page), bad) {
			t.Errorf("page contains %q", bad)
		}
	}
	for _, app := range []string{"server", "worker", "batch"} {
		if n := strings.Count(page, `class="lane lane-app" data-lane="`+app+`"`); n != 1 {
			t.Errorf("%d lanes for %s, want 1", n, app)
		}
	}
	for _, c := range []string{"acme", "globex", "initech"} {
		if n := strings.Count(page, `class="lane lane-token" data-lane="`+c+`"`); n != 1 {
			t.Errorf("%d token lanes for %s, want 1", n, c)
		}
	}
	if n := strings.Count(page, `<g class="refresh">`); n != 5 {
		t.Errorf("%d refresh marks, want 5", n)
	}
	// Each refresh is marked in the lane of the app that did it.
	lane := func(app string) string {
		i := strings.Index(page, `data-lane="`+app+`"`)
		j := strings.Index(page[i:], "</g>\n</g>")
		if j < 0 {
			j = len(page) - i
		}
		return page[i : i+j]
	}
	for app, want := range map[string][]string{"server": {"acme v2", "globex v3"}, "worker": {"globex v2", "initech v2"}, "batch": {"acme v3"}} {
		for _, w := range want {
			if !strings.Contains(lane(app), ">"+w+"<") {
				t.Errorf("%s lane lacks the mark %q", app, w)
			}
		}
	}
	// 3 bands for acme (v1..v3), 3 for globex, 2 for initech.
	if n := strings.Count(page, `<rect class="token"`); n != 8 {
		t.Errorf("%d token bands, want 8", n)
	}
	// initech's tokens live as long as its provider's: 4s.
	if !strings.Contains(page, "initech v2: obtained 12:00:04.500, expires 12:00:08.500") {
		t.Error("initech's second token does not live its provider's 4s")
	}
	// One row per provider, and each token lane names its provider.
	for title, want := range map[string][]string{
		"OAUTH_*":      {"HTTP Basic only", "acme, globex", "batch 1, server 2, worker 1"},
		"sandbox-form": {"no expires_in", ">initech</td>", "worker 1"},
	} {
		i := strings.Index(page, `<tr class="provider" data-provider="`+title+`">`)
		if i < 0 {
			t.Errorf("no row for provider %s", title)
			continue
		}
		row := page[i : i+strings.Index(page[i:], "</tr>")]
		for _, w := range want {
			if !strings.Contains(row, w) {
				t.Errorf("provider %s's row lacks %q: %s", title, w, row)
			}
		}
	}
	if !strings.Contains(page, "sandbox-form: 2 × 401: the imported first token said no expiry") {
		t.Error("the provider's note is missing")
	}
	for c, provider := range map[string]string{"acme": "OAUTH_*", "initech": "sandbox-form"} {
		i := strings.Index(page, `data-lane="`+c+`"`)
		if !strings.Contains(page[i:i+strings.Index(page[i:], "</g>")], `fill="#666">`+provider+`<`) {
			t.Errorf("the %s token lane does not name provider %s", c, provider)
		}
	}
	// Failures (401s and failed calls) are red, one bar per bad second.
	if n := strings.Count(page, `class="fail"`); n != 2 || !strings.Contains(page, `fill="#d62728"`) {
		t.Errorf("%d red bars, want 2", n)
	}
	if !strings.Contains(page, "FAIL") || !strings.Contains(page, "worker: 1 failed calls") {
		t.Error("the problems are not shown")
	}
	if !strings.Contains(page, "forced after a 401") {
		t.Error("details missing")
	}
}

func TestHTMLReportWithoutTimeline(t *testing.T) {
	r := syntheticReport()
	r.Timeline = nil
	var buf bytes.Buffer
	if err := r.WriteHTML(&buf); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "<svg") || !strings.Contains(buf.String(), "910") {
		t.Error("a report without timeline still shows its table and no picture")
	}
}

func TestParseRefreshLogAndBands(t *testing.T) {
	log := `{"time":"2026-01-01T12:00:02.5Z","level":"INFO","msg":"token refresh","app":"worker","pid":7,"connection":"acme","outcome":"ok","old_version":1,"new_version":2,"lock_wait_ms":1.5,"provider_ms":4.25,"forced":false}
{"time":"2026-01-01T12:00:03Z","level":"DEBUG","msg":"token refresh","app":"worker","pid":7,"connection":"acme","outcome":"skipped_fresh_after_lock","old_version":2,"new_version":2}
not json
{"time":"2026-01-01T12:00:04Z","level":"INFO","msg":"server listening","app":"worker","pid":7}
{"time":"2026-01-01T12:00:04.5Z","level":"INFO","msg":"token refresh","app":"worker","pid":7,"connection":"acme","outcome":"ok","old_version":2,"new_version":3,"forced":true}
`
	marks, err := ParseRefreshLog(strings.NewReader(log))
	if err != nil {
		t.Fatal(err)
	}
	if len(marks) != 2 || marks[0].Version != 2 || marks[0].PID != 7 || marks[0].ProviderMS != 4.25 || !marks[1].Forced || marks[1].Version != 3 {
		t.Fatalf("marks = %+v", marks)
	}
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	bands := TokenBands(map[string]time.Time{"acme": t0}, marks, map[string]time.Duration{"acme": 3 * time.Second})
	if len(bands) != 3 || bands[0].Version != 1 || !bands[0].Replaced.Equal(marks[0].At) || bands[2].Version != 3 || !bands[2].Replaced.IsZero() || !bands[2].Expiry.Equal(marks[1].At.Add(3*time.Second)) {
		t.Errorf("bands = %+v", bands)
	}
}
