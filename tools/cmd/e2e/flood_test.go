package e2e

import (
	"bufio"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestPublicFloodDuringRefreshStorm measures what a flood of garbage
// connect links (500 requests a second from one address, each a session
// that does not exist) does to a refresh storm on the token API: several
// clients reading, every 20 ms each, the tokens of connections whose
// access tokens live 1.5 s, so that a refresh is due every half second per
// connection. Rounds
// alternate the storm alone and the storm under the flood (ABBA, 8 of
// each), and the p99 of all the reads of each kind and their failures are
// compared: the flood may not change either by more than 10 %. The control runs the same against the
// server as it was before the public routes' limits and pool (the control
// build): the flood must then show.
//
// It runs on its own, not beside the other end-to-end tests, which would
// load the machine in ways that have nothing to do with the flood.
func TestPublicFloodDuringRefreshStorm(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds the apps and needs Postgres")
	}
	if raceEnabled {
		// The race detector multiplies the cost of every request of the
		// flood, in the test and in the server: on a small machine the
		// storm then measures the CPU the detector takes, not the server.
		t.Skip("a measurement: run it without -race")
	}
	bin := buildApps(t)
	t.Run("Limited", func(t *testing.T) {
		r := floodRun(t, bin, false, flood)
		if r.p99Ratio > 1.10 {
			t.Errorf("the flood changed the storm's p99 by more than 10%%: %.2f", r.p99Ratio)
		}
		if r.floodFailures > r.baseFailures+r.baseFailures/10 {
			t.Errorf("the flood changed the storm's failures by more than 10%%: %d without, %d with", r.baseFailures, r.floodFailures)
		}
	})
	t.Run("Control", func(t *testing.T) {
		r := floodRun(t, bin, true, flood)
		if r.p99Ratio <= 1.10 && r.floodFailures <= r.baseFailures+r.baseFailures/10 {
			t.Errorf("control: the flood changed nothing measurable on the unprotected server (p99 ratio %.2f, failures %d → %d): the test cannot fail",
				r.p99Ratio, r.baseFailures, r.floodFailures)
		}
	})
}

type floodResult struct {
	p99Ratio                    float64
	baseFailures, floodFailures int64
	answers                     map[int]int64 // the flood's, by status, over every round
	stack                       *stack        // still running its server
}

// flooder sends its flood until stop, counting the answers by status.
type flooder func(s *stack, stop chan struct{}, answers map[int]int64, mu *sync.Mutex)

const (
	floodConnections = 8
	floodClients     = 8
	floodRounds      = 8 // of each: the storm alone, the storm under the flood
	floodRound       = 2 * time.Second
	floodRate        = 500 // garbage requests a second
	floodPause       = 20 * time.Millisecond
)

// floodRun runs the rounds with f as the flood; the server keeps running
// until the test ends.
func floodRun(t *testing.T, bin string, control bool, f flooder) floodResult {
	s := newStack(t, bin, stackOpts{lifetime: 1500 * time.Millisecond, skew: time.Second})
	if control {
		s.serverBin = controlServer(t)
	}
	s.migrate()
	for i := range floodConnections {
		s.importGrant(fmt.Sprintf("c%d", i))
	}
	server := s.start("server")
	s.waitHealthy(server)
	t.Cleanup(func() { s.stop(server) })

	var base, flooded []stormRound
	for i := range 2 * floodRounds {
		withFlood := i%4 == 1 || i%4 == 2 // ABBA: drift cancels
		var r stormRound
		if withFlood {
			r = stormRoundOf(s, f)
		} else {
			r = stormRoundOf(s, nil)
		}
		if withFlood {
			flooded = append(flooded, r)
		} else {
			base = append(base, r)
		}
		sent := int64(0)
		for _, n := range r.flood {
			sent += n
		}
		t.Logf("round %d flood=%t: %d reads, %d failed, p50 %v, p99 %v; flood %.0f req/s, answers %v",
			i, withFlood, r.reads, r.failures, r.p50, r.p99, float64(sent)/floodRound.Seconds(), r.flood)
	}
	// The p99 of all the rounds of a kind: interleaved rounds share the
	// machine's other load, and a few hundred samples above the p99 make it
	// steadier than any one round's.
	basePool, floodPool := allReads(base), allReads(flooded)
	res := floodResult{
		p99Ratio:      float64(p99(floodPool)) / float64(p99(basePool)),
		baseFailures:  sum(base, func(r stormRound) int64 { return r.failures }),
		floodFailures: sum(flooded, func(r stormRound) int64 { return r.failures }),
		answers:       map[int]int64{},
		stack:         s,
	}
	for _, r := range flooded {
		for code, n := range r.flood {
			res.answers[code] += n
		}
	}
	medianRatio := float64(median(flooded, func(r stormRound) int64 { return int64(r.p99) })) / float64(median(base, func(r stormRound) int64 { return int64(r.p99) }))
	t.Logf("control=%t: p99 of the storm %v without the flood, %v with (ratio %.2f; of the rounds' medians %.2f); reads %d / %d; failures %d without, %d with",
		control, p99(basePool), p99(floodPool), res.p99Ratio, medianRatio, len(basePool), len(floodPool), res.baseFailures, res.floodFailures)
	return res
}

type stormRound struct {
	lat             []time.Duration // sorted
	reads, failures int64
	p50, p99        time.Duration
	flood           map[int]int64 // status → answers
}

// stormRoundOf runs the storm for one round, under flood f unless nil.
func stormRoundOf(s *stack, f flooder) stormRound {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var lat []time.Duration
	var failures atomic.Int64
	for c := range floodClients {
		wg.Go(func() {
			for n := c; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				code, _ := s.do(http.MethodGet, fmt.Sprintf("/connections/c%d/token", n%floodConnections), "")
				d := time.Since(start)
				if code != http.StatusOK {
					failures.Add(1)
				}
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
				time.Sleep(floodPause) // paced: the storm alone does not saturate the machine
			}
		})
	}
	floodAnswers := map[int]int64{}
	if f != nil {
		wg.Go(func() { f(s, stop, floodAnswers, &mu) })
	}
	time.Sleep(floodRound)
	close(stop)
	wg.Wait()
	slices.Sort(lat)
	r := stormRound{lat: lat, reads: int64(len(lat)), failures: failures.Load(), flood: floodAnswers}
	if len(lat) > 0 {
		r.p50, r.p99 = lat[len(lat)/2], lat[len(lat)*99/100]
	}
	return r
}

// flood sends floodRate garbage connect links a second until stop, from
// the test's one address, and counts the answers by status. It writes
// them on a few kept-alive connections, pipelined, each read back by one
// goroutine: the flood costs the test process little of the CPU that the
// storm, the sandbox and the server share.
func flood(s *stack, stop chan struct{}, answers map[int]int64, mu *sync.Mutex) {
	const conns = 5 // 100 a second each: one request per 10 ms batch
	var wg sync.WaitGroup
	defer wg.Wait()
	for range conns {
		wg.Go(func() { floodConn(s, stop, floodRate/conns, answers, mu, nil, garbageConnectLink) })
	}
}

func garbageConnectLink(s *stack) string {
	return "GET /oauth/connect?session=tgs_" + rand.Text() + " HTTP/1.1\r\nHost: " + s.addr + "\r\n\r\n"
}

// floodConn writes rate requests a second (each written by request) from
// local address from (nil: any), on a kept-alive connection, pipelined.
func floodConn(s *stack, stop chan struct{}, rate int, answers map[int]int64, mu *sync.Mutex, from net.IP, request func(*stack) string) {
	count := func(code int) {
		mu.Lock()
		answers[code]++
		mu.Unlock()
	}
	// Batches every 10 ms: a ticker at the request rate drops ticks on a
	// busy machine.
	const every = 10 * time.Millisecond
	tick := time.NewTicker(every)
	defer tick.Stop()
	owed := 0.0 // requests per tick, carried over: a rate under 100/s too
	for {
		d := net.Dialer{}
		if from != nil {
			d.LocalAddr = &net.TCPAddr{IP: from}
		}
		c, err := d.Dial("tcp", s.addr)
		if err != nil {
			count(0)
			select {
			case <-stop:
				return
			case <-tick.C:
				continue
			}
		}
		read := make(chan struct{})
		go func() {
			defer close(read)
			br := bufio.NewReader(c)
			for {
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				count(resp.StatusCode)
			}
		}()
		alive := true
		for alive {
			select {
			case <-stop:
				c.Close()
				<-read
				return
			case <-read:
				alive = false // the server closed it: dial again
			case <-tick.C:
				var b strings.Builder
				owed += float64(rate) * every.Seconds()
				for ; owed >= 1; owed-- {
					b.WriteString(request(s))
				}
				if _, err := io.WriteString(c, b.String()); err != nil {
					alive = false
				}
			}
		}
		c.Close()
		<-read
	}
}

func allReads(rs []stormRound) []time.Duration {
	var all []time.Duration
	for _, r := range rs {
		all = append(all, r.lat...)
	}
	slices.Sort(all)
	return all
}

func p99(sorted []time.Duration) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[len(sorted)*99/100]
}

func sum(rs []stormRound, f func(stormRound) int64) int64 {
	var n int64
	for _, r := range rs {
		n += f(r)
	}
	return n
}

func median(rs []stormRound, f func(stormRound) int64) int64 {
	v := make([]int64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	slices.Sort(v)
	return v[len(v)/2]
}
