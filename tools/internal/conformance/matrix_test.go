package conformance

import "testing"

func TestMatrixMarkdown(t *testing.T) {
	m := NewMatrix("a", "b")
	m.AddProvider("p1")
	m.Set("p2", "b", Cell{Pass: true, NA: true})
	m.Set("p2", "a", Cell{Pass: true, Refreshes: 1, Note: "x|y"})
	m.Set("p1", "b", Cell{Refreshes: 2, Reuse: 1, Note: "why"})
	m.SetProviderLog("p1", "0")
	got := m.Markdown()
	want := "| provider | a | b | provider's own log: reuse |\n|---|---|---|---|\n" +
		"| p1 | not run | **FAIL**: 2 refreshes, 1 reuse | 0 |\n" +
		"| p2 | pass: 1 refresh, 0 reuse | n/a | — |\n" +
		"\n- p1, b: why\n- p2, a: x|y\n"
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if !m.Failed() {
		t.Error("Failed() = false with a failed cell")
	}
}
