package e2e

import (
	"crypto/rand"
	"fmt"
	"net/http"
	"slices"
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
// alternate the storm alone and the storm under the flood (ABBA), and the
// medians of the rounds' p99 and failures are compared: the flood may not
// change either by more than 10 %. The control runs the same against the
// server as it was before the public routes' limits and pool (the control
// build): the flood must then show.
//
// It runs on its own, not beside the other end-to-end tests, which would
// load the machine in ways that have nothing to do with the flood.
func TestPublicFloodDuringRefreshStorm(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds the apps and needs Postgres")
	}
	bin := buildApps(t)
	t.Run("Limited", func(t *testing.T) {
		r := floodRun(t, bin, false)
		if r.p99Ratio > 1.10 {
			t.Errorf("the flood changed the storm's p99 by more than 10%%: %.2f", r.p99Ratio)
		}
		if r.floodFailures > r.baseFailures+r.baseFailures/10 {
			t.Errorf("the flood changed the storm's failures by more than 10%%: %d without, %d with", r.baseFailures, r.floodFailures)
		}
	})
	t.Run("Control", func(t *testing.T) {
		r := floodRun(t, bin, true)
		if r.p99Ratio <= 1.10 && r.floodFailures <= r.baseFailures+r.baseFailures/10 {
			t.Errorf("control: the flood changed nothing measurable on the unprotected server (p99 ratio %.2f, failures %d → %d): the test cannot fail",
				r.p99Ratio, r.baseFailures, r.floodFailures)
		}
	})
}

type floodResult struct {
	p99Ratio                    float64
	baseFailures, floodFailures int64
}

const (
	floodConnections = 8
	floodClients     = 8
	floodRounds      = 5 // of each: the storm alone, the storm under the flood
	floodRound       = 3 * time.Second
	floodRate        = 500 // garbage requests a second
	floodPause       = 20 * time.Millisecond
)

func floodRun(t *testing.T, bin string, control bool) floodResult {
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
	defer s.stop(server)

	var base, flooded []stormRound
	for i := range 2 * floodRounds {
		withFlood := i%4 == 1 || i%4 == 2 // ABBA: drift cancels
		r := stormRoundOf(s, withFlood)
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
	res := floodResult{
		p99Ratio:      float64(median(flooded, func(r stormRound) int64 { return int64(r.p99) })) / float64(median(base, func(r stormRound) int64 { return int64(r.p99) })),
		baseFailures:  median(base, func(r stormRound) int64 { return r.failures }),
		floodFailures: median(flooded, func(r stormRound) int64 { return r.failures }),
	}
	t.Logf("control=%t: median p99 with the flood / without: %.2f; median failures %d without, %d with",
		control, res.p99Ratio, res.baseFailures, res.floodFailures)
	return res
}

type stormRound struct {
	reads, failures int64
	p50, p99        time.Duration
	flood           map[int]int64 // status → answers
}

// stormRoundOf runs the storm for one round, under the flood if asked.
func stormRoundOf(s *stack, withFlood bool) stormRound {
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
	if withFlood {
		wg.Go(func() { flood(s, stop, floodAnswers, &mu) })
	}
	time.Sleep(floodRound)
	close(stop)
	wg.Wait()
	slices.Sort(lat)
	r := stormRound{reads: int64(len(lat)), failures: failures.Load(), flood: floodAnswers}
	if len(lat) > 0 {
		r.p50, r.p99 = lat[len(lat)/2], lat[len(lat)*99/100]
	}
	return r
}

// flood sends floodRate garbage connect links a second until stop, each
// from the test's one address, and counts the answers by status.
func flood(s *stack, stop chan struct{}, answers map[int]int64, mu *sync.Mutex) {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 256}}
	defer c.CloseIdleConnections()
	tick := time.NewTicker(time.Second / floodRate)
	defer tick.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	sem := make(chan struct{}, 256)
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		select {
		case sem <- struct{}{}:
		default:
			continue // as many in flight as the flood's connections: it is saturated
		}
		wg.Go(func() {
			defer func() { <-sem }()
			code := 0
			resp, err := c.Get("http://" + s.addr + "/oauth/connect?session=tgs_" + rand.Text())
			if err == nil {
				code = resp.StatusCode
				resp.Body.Close()
			}
			mu.Lock()
			answers[code]++
			mu.Unlock()
		})
	}
}

func median(rs []stormRound, f func(stormRound) int64) int64 {
	v := make([]int64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	slices.Sort(v)
	return v[len(v)/2]
}
