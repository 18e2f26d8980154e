package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// driver puts load on the server: GET resource from several clients and a
// steady stream of events.
type driver struct {
	s    *stack
	conn string
	stop chan struct{}
	wg   sync.WaitGroup

	// pause is held shared by every resource request; taking it exclusively
	// waits for those in flight and holds off new ones.
	pause sync.RWMutex

	ok, bad atomic.Int64
	mu      sync.Mutex
	badSeen []string
	events  []int64
	evBad   []string
}

func startDriver(s *stack, conn string, clients int, eventEvery time.Duration) *driver {
	d := &driver{s: s, conn: conn, stop: make(chan struct{})}
	for range clients {
		d.wg.Go(d.resourceLoop)
	}
	d.wg.Go(func() { d.eventLoop(eventEvery) })
	return d
}

func (d *driver) stopped() bool {
	select {
	case <-d.stop:
		return true
	default:
		return false
	}
}

func (d *driver) resourceLoop() {
	for !d.stopped() {
		d.pause.RLock()
		code, body := d.s.do(http.MethodGet, "/connections/"+d.conn+"/resource", "")
		d.pause.RUnlock()
		if code == http.StatusOK {
			d.ok.Add(1)
		} else {
			d.bad.Add(1)
			d.mu.Lock()
			if len(d.badSeen) < 5 {
				d.badSeen = append(d.badSeen, fmt.Sprintf("%d %s", code, body))
			}
			d.mu.Unlock()
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (d *driver) eventLoop(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for n := 0; ; n++ {
		select {
		case <-d.stop:
			return
		case <-t.C:
		}
		code, body := d.s.do(http.MethodPost, "/connections/"+d.conn+"/events", fmt.Sprintf(`{"n":%d}`, n))
		var resp struct {
			EventID int64 `json:"event_id"`
		}
		d.mu.Lock()
		if code == http.StatusAccepted && json.Unmarshal([]byte(body), &resp) == nil && resp.EventID > 0 {
			d.events = append(d.events, resp.EventID)
		} else {
			d.evBad = append(d.evBad, fmt.Sprintf("%d %s", code, body))
		}
		d.mu.Unlock()
	}
}

// finish stops the load and waits for requests in flight.
func (d *driver) finish() {
	close(d.stop)
	d.wg.Wait()
}

func (d *driver) eventIDs() []int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]int64(nil), d.events...)
}

// check reports failed calls and events that were not accepted.
func (d *driver) check() {
	t := d.s.t
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	if n := d.bad.Load(); n > 0 {
		t.Errorf("server: %d of %d resource calls failed, e.g. %q", n, n+d.ok.Load(), d.badSeen)
	}
	if len(d.evBad) > 0 {
		t.Errorf("server: %d events not accepted, e.g. %q", len(d.evBad), d.evBad[0])
	}
	if d.ok.Load() == 0 || len(d.events) == 0 {
		t.Errorf("no load went through: %d calls, %d events", d.ok.Load(), len(d.events))
	}
}
