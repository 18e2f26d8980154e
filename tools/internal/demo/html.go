package demo

import (
	"fmt"
	"html/template"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"
)

// WriteHTML writes the report as one self-contained HTML page (inline CSS
// and SVG, no script, nothing fetched): the summary and, if the run has a
// timeline, one lane per app process with its calls per second (failures
// in red) and a mark for each refresh it did, above a band per access
// token's lifetime for each connection.
func (r *Report) WriteHTML(w io.Writer) error {
	return pageTmpl.Execute(w, newPage(r))
}

// WriteHTMLFile writes the HTML report to path.
func (r *Report) WriteHTMLFile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := r.WriteHTML(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Geometry of the picture, in SVG user units.
const (
	svgWidth   = 1360.0
	plotLeft   = 150.0
	plotRight  = 20.0
	tokenLaneH = 30.0
	appLaneH   = 110.0
	laneGap    = 14.0
	axisH      = 30.0
)

// Colours: calls grey-green, failures red, one colour per connection.
const (
	colorOK   = "#7fb27f"
	colorFail = "#d62728"
)

var connColors = []string{"#1f77b4", "#9467bd", "#ff7f0e", "#17becf", "#8c564b"}

type page struct {
	R          *Report
	Apps       []appRow
	HasPicture bool
	Width      float64
	Height     float64
	Lanes      []laneView
	Ticks      []tick
	AxisY      float64
	Legend     []legendItem
	FailColor  string
	OKColor    string
	Marks      int
	Providers  []providerRow
	PlotLeft   float64
	PlotW      float64
	PlotEnd    float64
	TickEnd    float64
}

type providerRow struct {
	Title, Quirks, Connections, Lifetime string
	Refreshes                            int64
	Expected                             int
	Reuse, Rejected, Unauthorized        int64
	ByApp                                string
	Notes                                []string
}

type appRow struct {
	Name     string
	Calls    int64
	Failures int64
	Detail   string
}

type laneView struct {
	Kind   string // "token" or "app"
	Name   string
	Label  string
	Sub    string
	Y, H   float64
	Bands  []bandView
	Bars   []barView
	Marks  []markView
	MaxLbl string
}

type bandView struct {
	X, W, Y, H float64
	Fill       string
	Opacity    float64
	Label      string
	Title      string
}

type barView struct {
	X, W, Y, H float64
	Fill       string
	Class      string
	Title      string
}

type markView struct {
	X, Y1, Y2 float64
	LabelY    float64
	Color     string
	Label     string
	Title     string
}

type tick struct {
	X     float64
	Label string
}

type legendItem struct {
	Color, Label string
}

func newPage(r *Report) page {
	p := page{R: r, Width: svgWidth, FailColor: colorFail, OKColor: colorOK}
	for _, name := range []string{"server", "worker", "batch"} {
		a := r.Apps[name]
		p.Apps = append(p.Apps, appRow{Name: name, Calls: a.Calls, Failures: a.Failures, Detail: a.Detail})
	}
	providerOf := map[string]string{}
	for _, pr := range r.Providers {
		var byApp []string
		for _, app := range slices.Sorted(maps.Keys(pr.RefreshesByApp)) {
			byApp = append(byApp, fmt.Sprintf("%s %d", app, pr.RefreshesByApp[app]))
		}
		p.Providers = append(p.Providers, providerRow{Title: pr.Title(), Quirks: pr.Quirks, Connections: strings.Join(pr.Connections, ", "),
			Lifetime: secs(pr.AccessTokenLifetime), Refreshes: pr.Refreshes, Expected: pr.ExpectedRefreshes, Reuse: pr.RefreshReuse,
			Rejected: pr.RefreshRejected, Unauthorized: pr.Resource401, ByApp: strings.Join(byApp, ", "), Notes: pr.Notes})
		for _, c := range pr.Connections {
			providerOf[c] = pr.Title()
		}
	}
	t := r.Timeline
	if t == nil || !t.End.After(t.Start) {
		return p
	}
	p.HasPicture = true
	span := t.End.Sub(t.Start).Seconds()
	plotW := svgWidth - plotLeft - plotRight
	x := func(at time.Time) float64 {
		return plotLeft + max(0, min(span, at.Sub(t.Start).Seconds()))/span*plotW
	}
	secW := plotW / span
	color := map[string]string{}
	for i, name := range r.Connections {
		color[name] = connColors[i%len(connColors)]
		p.Legend = append(p.Legend, legendItem{Color: color[name], Label: name})
	}
	y := 10.0
	// One band lane per connection: each token's life.
	for _, name := range r.Connections {
		l := laneView{Kind: "token", Name: name, Label: name + " token", Sub: providerOf[name], Y: y, H: tokenLaneH}
		for i, b := range t.Tokens {
			if b.Connection != name {
				continue
			}
			end := b.Expiry
			if !b.Replaced.IsZero() && b.Replaced.Before(end) {
				end = b.Replaced
			}
			x0, x1 := x(b.From), x(end)
			title := fmt.Sprintf("%s v%d: obtained %s, expires %s", name, b.Version, clock(b.From), clock(b.Expiry))
			if !b.Replaced.IsZero() {
				title += fmt.Sprintf(", replaced %s (%.1fs before expiry)", clock(b.Replaced), b.Expiry.Sub(b.Replaced).Seconds())
			}
			bv := bandView{X: x0, W: max(x1-x0, 1), Y: y + 4, H: tokenLaneH - 8, Fill: color[name], Opacity: 0.35 + 0.3*float64(i%2), Title: title}
			if bv.W > 24 {
				bv.Label = fmt.Sprintf("v%d", b.Version)
			}
			l.Bands = append(l.Bands, bv)
		}
		p.Lanes = append(p.Lanes, l)
		y += tokenLaneH + laneGap/2
	}
	y += laneGap / 2
	// One lane per app process: calls per second, failures, refreshes.
	for _, lane := range t.Lanes {
		l := laneView{Kind: "app", Name: lane.App, Label: lane.App, Y: y, H: appLaneH}
		if lane.PID > 0 {
			l.Sub = fmt.Sprintf("pid %d", lane.PID)
		}
		var peak int64 = 1
		for _, s := range lane.Seconds {
			peak = max(peak, s.OK+s.Unauthorized+s.Failed)
		}
		l.MaxLbl = fmt.Sprintf("%d calls/s", peak)
		base := y + appLaneH - 4
		scale := (appLaneH - 26) / float64(peak)
		for _, s := range lane.Seconds {
			bx, bEnd := x(s.At), x(s.At.Add(time.Second))
			bw := max(min(secW, bEnd-bx)-1, 1)
			h := float64(s.OK) * scale
			l.Bars = append(l.Bars, barView{X: bx, W: bw, Y: base - h, H: h, Fill: colorOK, Class: "ok",
				Title: fmt.Sprintf("%s %s: %d calls ok", lane.App, clock(s.At), s.OK)})
			if bad := s.Unauthorized + s.Failed; bad > 0 {
				fh := max(float64(bad)*scale, 4) // always visible
				l.Bars = append(l.Bars, barView{X: bx, W: bw, Y: base - h - fh, H: fh, Fill: colorFail, Class: "fail",
					Title: fmt.Sprintf("%s %s: %d answered 401 (retried), %d failed", lane.App, clock(s.At), s.Unauthorized, s.Failed)})
			}
		}
		lastLabel, row := -1e9, 0
		for _, m := range t.Refreshes {
			if m.App != lane.App {
				continue
			}
			mx := x(m.At)
			// Labels of refreshes close together go on successive rows.
			if mx-lastLabel < 70 {
				row = (row + 1) % 3
			} else {
				row = 0
			}
			lastLabel = mx
			title := fmt.Sprintf("%s (pid %d) refreshed %s to v%d at %s: lock wait %.1f ms, provider %.1f ms", m.App, m.PID, m.Connection, m.Version, clock(m.At), m.LockWaitMS, m.ProviderMS)
			if m.Forced {
				title += ", forced after a 401"
			}
			l.Marks = append(l.Marks, markView{X: mx, Y1: y + 2, Y2: base, LabelY: y + 2 + 12*float64(row), Color: color[m.Connection], Label: fmt.Sprintf("%s v%d", m.Connection, m.Version), Title: title})
			p.Marks++
		}
		p.Lanes = append(p.Lanes, l)
		y += appLaneH + laneGap
	}
	p.AxisY, p.TickEnd = y, y+5
	p.PlotLeft, p.PlotW, p.PlotEnd = plotLeft, plotW, plotLeft+plotW
	step := tickStep(span)
	for s := 0.0; s <= span+1e-9; s += step {
		p.Ticks = append(p.Ticks, tick{X: plotLeft + s/span*plotW, Label: fmt.Sprintf("%gs", s)})
	}
	p.Height = y + axisH
	return p
}

func tickStep(span float64) float64 {
	for _, s := range []float64{1, 2, 5, 10, 15, 30, 60, 120, 300} {
		if span/s <= 15 {
			return s
		}
	}
	return 600
}

func clock(t time.Time) string { return t.UTC().Format("15:04:05.000") }

var pageTmpl = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>tokenguard demo report</title>
<style>
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:16px 24px;color:#222}
h1{font-size:20px;margin:0 0 4px} .verdict{font-weight:600}
.pass{color:#2a7a2a} .failtxt{color:` + colorFail + `}
table{border-collapse:collapse;margin:8px 0} td,th{padding:2px 10px;text-align:right} td:first-child,th:first-child{text-align:left}
.note{color:#555;font-size:12px} svg text{font:11px sans-serif} .lane-label{font-weight:600;font-size:12px}
.swatch{display:inline-block;width:12px;height:12px;margin:0 4px -2px 12px}
</style></head><body>
<h1>tokenguard demo: {{printf "%.0f" .R.DurationSeconds}}s, {{len .R.Connections}} connections at {{len .R.Providers}} providers, access tokens refreshed {{.R.RefreshSkew}}s early</h1>
<p class="verdict {{if .R.OK}}pass{{else}}failtxt{{end}}">{{if .R.OK}}PASS: no failed call, no refresh-token reuse at any provider{{else}}FAIL{{range .R.Problems}}<br>– {{.}}{{end}}{{end}}</p>
<table><tr><th>app</th><th>API calls</th><th>failures</th><th></th></tr>
{{range .Apps}}<tr><td>{{.Name}}</td><td>{{.Calls}}</td><td>{{.Failures}}</td><td style="text-align:left">{{.Detail}}</td></tr>{{end}}
</table>
<table class="providers"><tr><th>provider</th><th style="text-align:left">quirks</th><th style="text-align:left">connections</th><th>tokens live</th><th>refreshes</th><th>expected</th><th>reuse</th><th>refused</th><th>401</th><th style="text-align:left">refreshes by app (User-Agent)</th></tr>
{{range .Providers}}<tr class="provider" data-provider="{{.Title}}"><td>{{.Title}}</td><td style="text-align:left">{{.Quirks}}</td><td style="text-align:left">{{.Connections}}</td><td>{{.Lifetime}}</td><td>{{.Refreshes}}</td><td>{{.Expected}}</td><td>{{.Reuse}}</td><td>{{.Rejected}}</td><td>{{.Unauthorized}}</td><td style="text-align:left">{{.ByApp}}</td></tr>{{end}}
</table>
{{range .Providers}}{{$t := .Title}}{{range .Notes}}<p class="note">{{$t}}: {{.}}</p>{{end}}{{end}}
{{if .HasPicture}}
<p class="note">One lane per app process: green bars are its calls to the API per second, red is calls answered 401 or failed; a vertical line marks a refresh that process did (connection and stored version). Above, one band per access token of each connection, from when it was obtained to its replacement. Hover for details.
{{range .Legend}}<span class="swatch" style="background:{{.Color}}"></span>{{.Label}}{{end}}<span class="swatch" style="background:{{.OKColor}}"></span>calls ok<span class="swatch" style="background:{{.FailColor}}"></span>401 / failed</p>
<svg xmlns="http://www.w3.org/2000/svg" width="{{.Width}}" height="{{.Height}}" viewBox="0 0 {{.Width}} {{.Height}}" role="img" aria-label="timeline of the demo run">
<rect x="0" y="0" width="{{.Width}}" height="{{.Height}}" fill="#fff"/>
{{range .Lanes}}<g class="lane lane-{{.Kind}}" data-lane="{{.Name}}">
<rect x="{{$.PlotLeft}}" y="{{.Y}}" width="{{$.PlotW}}" height="{{.H}}" fill="{{if eq .Kind "app"}}#f6f7f9{{else}}#fbfbfb{{end}}" stroke="#ddd"/>
<text class="lane-label" x="8" y="{{.Y}}" dy="16">{{.Label}}</text>{{if .Sub}}<text x="8" y="{{.Y}}" dy="31" fill="#666">{{.Sub}}</text>{{end}}{{if .MaxLbl}}<text x="8" y="{{.Y}}" dy="46" fill="#999">max {{.MaxLbl}}</text>{{end}}
{{range .Bands}}<rect class="token" x="{{.X}}" y="{{.Y}}" width="{{.W}}" height="{{.H}}" fill="{{.Fill}}" fill-opacity="{{.Opacity}}" stroke="#fff"><title>{{.Title}}</title></rect>{{if .Label}}<text x="{{.X}}" dx="3" y="{{.Y}}" dy="15" fill="#fff">{{.Label}}</text>{{end}}
{{end}}{{range .Bars}}<rect class="{{.Class}}" x="{{.X}}" y="{{.Y}}" width="{{.W}}" height="{{.H}}" fill="{{.Fill}}"><title>{{.Title}}</title></rect>
{{end}}{{range .Marks}}<g class="refresh"><line x1="{{.X}}" x2="{{.X}}" y1="{{.Y1}}" y2="{{.Y2}}" stroke="{{.Color}}" stroke-width="2"/><circle cx="{{.X}}" cy="{{.Y1}}" r="4" fill="{{.Color}}"/><text x="{{.X}}" dx="4" y="{{.LabelY}}" dy="12" fill="{{.Color}}">{{.Label}}</text><title>{{.Title}}</title></g>
{{end}}</g>
{{end}}<g class="axis"><line x1="{{.PlotLeft}}" x2="{{.PlotEnd}}" y1="{{.AxisY}}" y2="{{.AxisY}}" stroke="#888"/>
{{range .Ticks}}<line x1="{{.X}}" x2="{{.X}}" y1="{{$.AxisY}}" y2="{{$.TickEnd}}" stroke="#888"/><text x="{{.X}}" y="{{$.AxisY}}" dy="16" text-anchor="middle" fill="#555">{{.Label}}</text>
{{end}}</g>
</svg>
<p class="note">{{.Marks}} refreshes logged by the apps ("token refresh" lines, LOG_FORMAT=json); times are from the start of the run.</p>
{{end}}
</body></html>
`))
