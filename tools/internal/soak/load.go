package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// call is a failed call the soak made (or a failed batch round).
type call struct {
	kind       string // "resource", "event", "batch"
	start, end time.Time
	err        string
}

type calls struct {
	mu   sync.Mutex
	ok   map[string]int64
	okAt map[string][]time.Time // starts of successful calls by kind, in order of completion
	bad  []call
}

func (c *calls) add(kind string, start, end time.Time, ok bool, err string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ok == nil {
		c.ok, c.okAt = map[string]int64{}, map[string][]time.Time{}
	}
	if ok {
		c.ok[kind]++
		c.okAt[kind] = append(c.okAt[kind], start)
		return
	}
	c.bad = append(c.bad, call{kind: kind, start: start, end: end, err: err})
}

// firstOKAfter is the earliest start of a successful call of kind that
// started at or after t.
func (c *calls) firstOKAfter(kind string, t time.Time) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var best time.Time
	for _, s := range c.okAt[kind] {
		if !s.Before(t) && (best.IsZero() || s.Before(best)) {
			best = s
		}
	}
	return best, !best.IsZero()
}

type events struct {
	mu  sync.Mutex
	all []int64
	at  []time.Time
	// exempt: accepted around a failover to an asynchronous standby,
	// which may have lost them with the rest of the last commits.
	exempt map[int64]bool
}

func (e *events) add(id int64) {
	e.mu.Lock()
	e.all = append(e.all, id)
	e.at = append(e.at, time.Now())
	e.mu.Unlock()
}

// ids are the events accepted, but the exempt ones.
func (e *events) ids() []int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]int64, 0, len(e.all))
	for _, id := range e.all {
		if !e.exempt[id] {
			out = append(out, id)
		}
	}
	return out
}

// exemptBetween exempts the events accepted between from and to, and
// returns how many.
func (e *events) exemptBetween(from, to time.Time) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.exempt == nil {
		e.exempt = map[int64]bool{}
	}
	n := 0
	for i, at := range e.at {
		if !at.Before(from) && !at.After(to) && !e.exempt[e.all[i]] {
			e.exempt[e.all[i]] = true
			n++
		}
	}
	return n
}

func (e *events) exempted() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.exempt)
}

// load calls the server's resource route from Concurrency clients and
// posts events, until ctx ends.
func (s *soak) load(ctx context.Context) {
	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer client.CloseIdleConnections()
	var wg sync.WaitGroup
	for i := range s.o.Concurrency {
		wg.Go(func() {
			for n := i; ctx.Err() == nil; n++ {
				start := time.Now()
				err := s.callResource(client, connections[n%len(connections)])
				s.calls.add("resource", start, time.Now(), err == nil, errText(err))
				pause := 20 * time.Millisecond
				if err != nil {
					pause = 200 * time.Millisecond // a down server is asked 5 times a second, not 50
				}
				sleep(ctx, pause)
			}
		})
	}
	wg.Go(func() {
		t := time.NewTicker(time.Second / time.Duration(s.o.EventsPerSecond))
		defer t.Stop()
		for n := 0; ; n++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			start := time.Now()
			id, err := s.postEvent(client, connections[n%len(connections)])
			if err == nil {
				s.events.add(id)
			}
			s.calls.add("event", start, time.Now(), err == nil, errText(err))
		}
	})
	wg.Wait()
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func (s *soak) callResource(c *http.Client, name string) error {
	req, _ := http.NewRequest(http.MethodGet, s.server+"/connections/"+name+"/resource", nil)
	req.Header.Set("Authorization", "Bearer "+s.key)
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

func (s *soak) postEvent(c *http.Client, name string) (int64, error) {
	req, _ := http.NewRequest(http.MethodPost, s.server+"/connections/"+name+"/events", strings.NewReader(`{"source":"soak"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+s.key)
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		return 0, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	var body struct {
		EventID int64 `json:"event_id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return 0, err
	}
	return body.EventID, nil
}

// checks holds what the continuous checks saw.
type checks struct {
	mu          sync.Mutex
	reuse       int64
	reuseAt     string
	needsReauth map[string]string   // connection -> first seen (offset) and reason
	regranted   map[string][]string // failover soak: connection -> reasons of the needs_reauth it was granted again after
}

// watch checks the invariants that can break at any moment, every second.
func (s *soak) watch(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.check(ctx)
		}
	}
}

func (s *soak) check(ctx context.Context) {
	now := s.since(time.Now())
	st := s.sb.Stats()
	s.checks.mu.Lock()
	if st.RefreshReuse > s.checks.reuse {
		s.checks.reuse = st.RefreshReuse
		if s.checks.reuseAt == "" {
			s.checks.reuseAt = fmtOffset(now)
			s.say("!! %s refresh-token reuse at the provider", fmtOffset(now))
		}
	}
	s.checks.mu.Unlock()
	// The sandbox revokes nothing by itself: every needs_reauth is wrong
	// unless a reuse killed the grant (counted above).
	_ = s.query(ctx, func(ctx context.Context, c *pgx.Conn) error {
		rows, err := c.Query(ctx, `SELECT c.name, t.status_reason FROM tokenguard_connections c JOIN tokenguard_tokens t ON t.connection_id = c.id WHERE t.status = 'needs_reauth'`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var name, reason string
			if err := rows.Scan(&name, &reason); err != nil {
				return err
			}
			s.checks.mu.Lock()
			if s.checks.needsReauth == nil {
				s.checks.needsReauth = map[string]string{}
			}
			if _, seen := s.checks.needsReauth[name]; !seen {
				s.checks.needsReauth[name] = fmtOffset(now) + " " + reason
				s.say("!! %s connection %s marked needs_reauth: %s", fmtOffset(now), name, reason)
			}
			s.checks.mu.Unlock()
		}
		return rows.Err()
	})
}

// progress prints a line every 30 seconds.
func (s *soak) progress(ctx context.Context) {
	t := time.NewTicker(30 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st := s.sb.Stats()
		s.calls.mu.Lock()
		ok, bad := s.calls.ok["resource"]+s.calls.ok["event"], len(s.calls.bad)
		s.calls.mu.Unlock()
		s.say("%7s  calls %d ok/%d failed · events %d · refreshes %d · reuse %d · faults %d",
			fmtOffset(s.since(time.Now())), ok, bad, len(s.events.ids()), st.Refreshes, st.RefreshReuse, s.faults.count())
	}
}

func fmtOffset(d time.Duration) string {
	d = d.Round(100 * time.Millisecond)
	m := int(d / time.Minute)
	sec := (d - time.Duration(m)*time.Minute).Seconds()
	return fmt.Sprintf("%d:%04.1f", m, sec)
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(p*float64(len(s))+0.5) - 1 // nearest rank
	return s[min(max(i, 0), len(s)-1)]
}
