package demo

import (
	"testing"
	"time"
)

func TestExpectedRefreshes(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	cycle := 2 * time.Second
	for _, c := range []struct {
		name              string
		granted, from, to time.Time
		want              int
	}{
		{"use ends before the token goes stale", t0, t0, at(1900 * time.Millisecond), 0},
		{"stale exactly at the end", t0, t0, at(2 * time.Second), 1},
		{"continuous use over 12s from the grant", t0, t0, at(12 * time.Second), 6},
		{"continuous use, 13.9s", t0, t0, at(13900 * time.Millisecond), 6},
		{"use starts after the token went stale", t0, at(5 * time.Second), at(10 * time.Second), 3}, // 5, 7, 9
		{"use starts while fresh", t0, at(time.Second), at(6 * time.Second), 3},                     // 2, 4, 6
		{"empty window", t0, at(3 * time.Second), at(3 * time.Second), 0},
	} {
		if got := ExpectedRefreshes(c.granted, c.from, c.to, cycle); got != c.want {
			t.Errorf("%s: ExpectedRefreshes = %d, want %d", c.name, got, c.want)
		}
	}
	if got := ExpectedRefreshes(t0, t0, at(time.Hour), 0); got != 0 {
		t.Errorf("zero cycle: %d", got)
	}
}
