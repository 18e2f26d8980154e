package conformance

import (
	"fmt"
	"slices"
	"strings"
	"sync"
)

// Cell is one provider × scenario result.
type Cell struct {
	Pass      bool
	Refreshes int    // refresh_token grants the server answered 200 during the scenario
	Reuse     int    // refresh-token reuse seen by the proxy or reported by the server
	Note      string // what else the reader should know, or why it failed
	// NA: the scenario does not apply to the row (rendered "n/a").
	NA bool
}

// Matrix collects cells and renders them. It is safe for concurrent use.
type Matrix struct {
	mu        sync.Mutex
	providers []string
	scenarios []string
	cells     map[[2]string]Cell
	footer    map[string]string // per provider: the server's own reuse count, from its log
}

// NewMatrix lists the scenarios in column order.
func NewMatrix(scenarios ...string) *Matrix {
	return &Matrix{scenarios: scenarios, cells: map[[2]string]Cell{}, footer: map[string]string{}}
}

// AddProvider adds a row; rows appear in the order they were added (or
// first set).
func (m *Matrix) AddProvider(provider string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !slices.Contains(m.providers, provider) {
		m.providers = append(m.providers, provider)
	}
}

// Set records a cell.
func (m *Matrix) Set(provider, scenario string, c Cell) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !slices.Contains(m.providers, provider) {
		m.providers = append(m.providers, provider)
	}
	m.cells[[2]string{provider, scenario}] = c
}

// SetProviderLog records what the provider's own log or counters said
// about refresh-token reuse over the whole run.
func (m *Matrix) SetProviderLog(provider, text string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !slices.Contains(m.providers, provider) {
		m.providers = append(m.providers, provider)
	}
	m.footer[provider] = text
}

// Failed reports whether any cell failed.
func (m *Matrix) Failed() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, c := range m.cells {
		if !c.Pass {
			return true
		}
	}
	return false
}

// Markdown renders the table (one row per provider, one column per
// scenario, the provider's own reuse count last; a scenario that did not
// run shows "not run"), then each cell's note, and why failed cells failed.
func (m *Matrix) Markdown() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var b, notes strings.Builder
	b.WriteString("| provider |")
	for _, s := range m.scenarios {
		b.WriteString(" " + s + " |")
	}
	b.WriteString(" provider's own log: reuse |\n|---|")
	b.WriteString(strings.Repeat("---|", len(m.scenarios)+1))
	b.WriteString("\n")
	for _, p := range m.providers {
		b.WriteString("| " + p + " |")
		for _, s := range m.scenarios {
			c, ok := m.cells[[2]string{p, s}]
			b.WriteString(" " + cellText(c, ok) + " |")
			if ok && c.Note != "" {
				fmt.Fprintf(&notes, "- %s, %s: %s\n", p, s, c.Note)
			}
		}
		f := m.footer[p]
		if f == "" {
			f = "—"
		}
		b.WriteString(" " + f + " |\n")
	}
	if notes.Len() > 0 {
		b.WriteString("\n" + notes.String())
	}
	return b.String()
}

func cellText(c Cell, ok bool) string {
	if !ok {
		return "not run"
	}
	if c.NA {
		return "n/a"
	}
	verdict := "pass"
	if !c.Pass {
		verdict = "**FAIL**"
	}
	return fmt.Sprintf("%s: %d refresh%s, %d reuse", verdict, c.Refreshes, plural(c.Refreshes, "es"), c.Reuse)
}

func plural(n int, suffix string) string {
	if n == 1 {
		return ""
	}
	return suffix
}
