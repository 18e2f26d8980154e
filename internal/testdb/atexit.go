package testdb

import "sync"

var (
	atExitMu sync.Mutex
	atExit   []func()
)

// AtExit registers f to run when Main's tests and examples have run,
// before the server is stopped: the cleanup of what examples (which have
// no testing.TB) create. Later registrations run first.
func AtExit(f func()) {
	atExitMu.Lock()
	defer atExitMu.Unlock()
	atExit = append(atExit, f)
}

func runAtExit() {
	atExitMu.Lock()
	fs := atExit
	atExit = nil
	atExitMu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}
