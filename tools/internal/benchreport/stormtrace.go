package benchreport

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"golang.org/x/exp/trace"
)

// Storm is what the execution trace of one storm (BenchmarkRefreshStorm
// with STORM_TRACE set) shows: the callers' waits, and where the storm's
// critical path went. The phases are found by the stacks of the goroutines
// that do the work (the lock transaction, the provider's sleep, the
// write); a phase the trace does not show is -1.
type Storm struct {
	Calls          int           // "call" regions, one per caller
	P50, P99, Span time.Duration // callers' waits; first call's start to the last call's end
	// LockSent: storm start to the first lock request written to the
	// database.
	LockSent time.Duration
	// ToProvider: storm start to the provider starting its answer (the lock
	// won, the token re-read, the request sent).
	ToProvider time.Duration
	// Provider: the provider's own latency.
	Provider time.Duration
	// ToCommit: the provider's answer to the first answer the database
	// gives after the holder's write and durable commit were sent.
	ToCommit time.Duration
	// WakeAll: that answer to the last caller's return: every process
	// learns the new token and its waiters run.
	WakeAll time.Duration
	// Arrived: storm start to the moment all callers but one per process
	// are waiting: the flood of arriving goroutines has run.
	Arrived time.Duration
	// Release: from a process's last answer from the database to the
	// moment it releases its waiters (tokenguard: the flight's goroutine
	// ends; the floor: the call that did the work returns), median over
	// the processes.
	Release time.Duration
	// Woken: how long a caller woken by another goroutine waited for a
	// CPU, p50 and p99 over the storm's callers.
	WokenP50, WokenP99 time.Duration
	// Pings: liveness checks a connection pool ran before handing out a
	// connection (database/sql's ResetSession); Prepares: statements
	// prepared before they ran (pgx's statement cache missed). Each costs
	// a round trip.
	Pings, Prepares int
	GCAssists       int // GC mark assists during the storm
}

// arrivals is how many callers of a storm wait for another one (3 processes
// x 200 callers, less the one per process that may do the work itself).
const arrivals = 3*200 - 3

// stack markers of the work a storm's critical path consists of.
const (
	markSleep   = "handleRefresh" // the sandbox provider's latency
	markPing    = "ResetSession"  // database/sql's liveness ping
	markPrepare = "sendBatchExtendedWithDescription.func2"
	markWrite   = "TokenRepository).Fail"  // tokenguard's record of a failure, in a lock transaction
	markSave    = "TokenRepository).Store" // tokenguard's token write: lock, write and COMMIT
	markStore   = "tokenguard/repository." // any of tokenguard's database calls
	markLock    = "TokenRepository).Claim" // tokenguard's claim: lock, re-read, lease and COMMIT
	markFloor   = "floorStack).refresh"    // the protocol floor's transaction
	markFlight  = "flights).start.func1"   // tokenguard's flight goroutine
)

// ReadStorm reads the execution trace of one storm.
func ReadStorm(r io.Reader) (Storm, error) {
	tr, err := trace.NewReader(r)
	if err != nil {
		return Storm{}, err
	}
	var (
		s = Storm{LockSent: -1, ToProvider: -1, Provider: -1, ToCommit: -1, WakeAll: -1, Arrived: -1, WokenP50: -1, WokenP99: -1, Release: -1}

		t0, lastEnd, firstEnd          trace.Time
		lockSent, sleepStart, sleepEnd trace.Time
		commitSent, commitAnswered     trace.Time
		arrived                        trace.Time
		parked                         int
		waits, woken, releases         []time.Duration

		began     = map[trace.GoID]trace.Time{} // callers in their call
		blockedIn = map[trace.GoID]string{}     // the reason and stack a goroutine parked with
		wokenAt   = map[trace.GoID]trace.Time{} // callers woken, not yet running
		answered  = map[trace.GoID]trace.Time{} // the last answer from the database a goroutine woke to
		flights   = map[trace.GoID]bool{}       // tokenguard's flight goroutines
	)
	for {
		ev, err := tr.ReadEvent()
		if err == io.EOF {
			break
		}
		if err != nil {
			return Storm{}, err
		}
		t := ev.Time()
		switch ev.Kind() {
		case trace.EventRegionBegin:
			if ev.Region().Type == "call" {
				began[ev.Goroutine()] = t
				if t0 == 0 {
					t0 = t
				}
			}
		case trace.EventRegionEnd:
			if b, ok := began[ev.Goroutine()]; ok && ev.Region().Type == "call" {
				if a, ok := answered[ev.Goroutine()]; ok && strings.Contains(blockedIn[ev.Goroutine()], markFloor) {
					releases = append(releases, time.Duration(t-a))
				}
				delete(began, ev.Goroutine())
				waits = append(waits, time.Duration(t-b))
				lastEnd = t
				if firstEnd == 0 {
					firstEnd = t
				}
			}
		case trace.EventRangeBegin:
			if t0 != 0 && ev.Range().Name == "GC mark assist" {
				s.GCAssists++
			}
		case trace.EventStateTransition:
			st := ev.StateTransition()
			if t0 == 0 || st.Resource.Kind != trace.ResourceGoroutine {
				continue
			}
			id := st.Resource.Goroutine()
			from, to := st.Goroutine()
			stack := funcs(st.Stack)
			if from == trace.GoNotExist && strings.Contains(stack, markFlight) {
				flights[id] = true
			}
			if to == trace.GoNotExist && flights[id] {
				if a, ok := answered[id]; ok {
					releases = append(releases, time.Duration(t-a))
				}
			}
			switch {
			case to == trace.GoSyscall && strings.HasPrefix(stack, "syscall.write"):
				switch {
				case strings.Contains(stack, markPing):
					s.Pings++
				case strings.Contains(stack, markPrepare):
					s.Prepares++
				case lockSent == 0 && (strings.Contains(stack, markLock) || strings.Contains(stack, markFloor)):
					lockSent = t
				}
			case to == trace.GoRunning:
				if w, ok := wokenAt[id]; ok {
					woken = append(woken, time.Duration(t-w))
					delete(wokenAt, id)
				}
			case to == trace.GoWaiting:
				blockedIn[id] = st.Reason + " " + stack
				if _, calling := began[id]; calling && st.Reason != "network" {
					parked++
					if parked == arrivals && arrived == 0 {
						arrived = t
					}
				}
				if st.Reason == "sleep" && strings.Contains(stack, markSleep) && sleepStart == 0 {
					sleepStart = t
				}
				if st.Reason == "network" && sleepEnd != 0 && commitSent == 0 && !strings.Contains(stack, markPrepare) &&
					(writes(stack) || strings.Contains(stack, markFloor)) {
					commitSent = t
				}
			case from == trace.GoWaiting:
				in := blockedIn[id]
				if strings.HasPrefix(in, "network") && (strings.Contains(in, markStore) || strings.Contains(in, markFloor)) {
					answered[id] = t
				}
				if _, calling := began[id]; calling && ev.Goroutine() != trace.NoGoroutine && ev.Goroutine() != id {
					wokenAt[id] = t
				}
				if strings.HasPrefix(in, "sleep") && strings.Contains(in, markSleep) && sleepEnd == 0 {
					sleepEnd = t
				}
				if commitSent != 0 && commitAnswered == 0 && t > commitSent && strings.HasPrefix(in, "network") &&
					(writes(in) || strings.Contains(in, markLock) || strings.Contains(in, markFloor)) {
					commitAnswered = t
				}
			}
		}
	}
	if len(waits) == 0 {
		return Storm{}, fmt.Errorf("no \"call\" region in the trace")
	}
	slices.Sort(waits)
	s.Calls, s.P50, s.P99, s.Span = len(waits), waits[len(waits)/2], waits[len(waits)*99/100], time.Duration(lastEnd-t0)
	between := func(a, b trace.Time) time.Duration {
		if a == 0 || b == 0 || b < a {
			return -1
		}
		return time.Duration(b - a)
	}
	s.LockSent = between(t0, lockSent)
	s.ToProvider = between(t0, sleepStart)
	s.Provider = between(sleepStart, sleepEnd)
	s.ToCommit = between(sleepEnd, commitAnswered)
	s.WakeAll = between(commitAnswered, lastEnd)
	s.Arrived = between(t0, arrived)
	if len(releases) > 0 {
		slices.Sort(releases)
		s.Release = releases[len(releases)/2]
	}
	if len(woken) > 0 {
		slices.Sort(woken)
		s.WokenP50, s.WokenP99 = woken[len(woken)/2], woken[len(woken)*99/100]
	}
	return s, nil
}

// funcs is a stack's function names, innermost first, separated by "<".
// writes reports whether stack is tokenguard's, writing to the database.
func writes(stack string) bool {
	return strings.Contains(stack, markWrite) || strings.Contains(stack, markSave)
}

func funcs(s trace.Stack) string {
	var b strings.Builder
	for f := range s.Frames() {
		if b.Len() > 0 {
			b.WriteByte('<')
		}
		b.WriteString(f.Func)
	}
	return b.String()
}

// Median is the median of the phase got picks from each storm, over the
// storms that show it (false if none does).
func Median(storms []Storm, got func(Storm) time.Duration) (time.Duration, bool) {
	var vs []time.Duration
	for _, s := range storms {
		if v := got(s); v >= 0 {
			vs = append(vs, v)
		}
	}
	return median(vs)
}
