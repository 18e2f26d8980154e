//go:build race

package demo

// raceEnabled: the apps are built with -race too, so a data race in any of
// them makes it exit non-zero and fails the run.
const raceEnabled = true
