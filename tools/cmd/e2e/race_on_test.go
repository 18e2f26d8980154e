//go:build race

package e2e

// raceEnabled: the apps are built with -race too, so a data race in any of
// them makes it exit non-zero and fails the test.
const raceEnabled = true
