// Package ratelimit is the HTTP edges' token buckets by key (an API key, a client address, a
// console login form), optionally with bounds on the requests at once.
package ratelimit

import (
	"maps"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// maxKeys is how many keys are remembered; forgetting one is the lenient way.
const maxKeys = 4096

// Limits are a token bucket per key and, for Acquire, bounds on a key's
// requests at once and on all keys' together.
type Limits[K comparable] struct {
	rate     rate.Limit
	burst    int
	inFlight int           // 0: unbounded
	total    chan struct{} // nil: unbounded

	mu   sync.Mutex
	keys map[K]*state
}

type state struct {
	lim      *rate.Limiter
	inFlight int
	seen     time.Time
}

// New limits each key to r a second after burst, and at most inFlight of
// its requests and total of all at once (0: unbounded).
func New[K comparable](r rate.Limit, burst, inFlight, total int) *Limits[K] {
	l := &Limits[K]{rate: r, burst: burst, inFlight: inFlight, keys: map[K]*state{}}
	if total > 0 {
		l.total = make(chan struct{}, total)
	}
	return l
}

// Take takes a token from key's bucket at now, or says how long until there is one.
func (l *Limits[K]) Take(key K, now time.Time) time.Duration {
	l.mu.Lock()
	st := l.state(key, now)
	l.mu.Unlock()
	return take(st.lim, now)
}

// Acquire is Take within the bounds on requests at once. release ends the
// request; it is nil when refused, and wait says how long to wait.
func (l *Limits[K]) Acquire(key K) (release func(), wait time.Duration) {
	now := time.Now()
	l.mu.Lock()
	st := l.state(key, now)
	if l.inFlight > 0 && st.inFlight >= l.inFlight {
		l.mu.Unlock()
		return nil, time.Second
	}
	if d := take(st.lim, now); d > 0 {
		l.mu.Unlock()
		return nil, d
	}
	st.inFlight++
	l.mu.Unlock()
	if l.total == nil {
		return func() { l.done(st) }, 0
	}
	select {
	case l.total <- struct{}{}:
		return func() { <-l.total; l.done(st) }, 0
	default:
		l.done(st)
		return nil, time.Second
	}
}

func (l *Limits[K]) done(st *state) {
	l.mu.Lock()
	st.inFlight--
	l.mu.Unlock()
}

// state is key's, made if new; l.mu is held. When full, l forgets the idle
// keys unseen for a minute first, then every idle one.
func (l *Limits[K]) state(key K, now time.Time) *state {
	st, ok := l.keys[key]
	if !ok {
		if len(l.keys) >= maxKeys {
			maps.DeleteFunc(l.keys, func(_ K, st *state) bool { return st.inFlight == 0 && now.Sub(st.seen) > time.Minute })
		}
		if len(l.keys) >= maxKeys {
			maps.DeleteFunc(l.keys, func(_ K, st *state) bool { return st.inFlight == 0 })
		}
		st = &state{lim: rate.NewLimiter(l.rate, l.burst)}
		l.keys[key] = st
	}
	st.seen = now
	return st
}

// take takes a token from lim at now, or says how long until there is one.
func take(lim *rate.Limiter, now time.Time) time.Duration {
	res := lim.ReserveN(now, 1)
	d := res.DelayFrom(now)
	if d > 0 {
		res.CancelAt(now)
	}
	return d
}

// ClientAddr is r's client address: the TCP peer, without its port.
func ClientAddr(r *http.Request) string {
	addr, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return addr
}

// SetRetryAfter sets Retry-After to d in whole seconds, rounded up.
func SetRetryAfter(w http.ResponseWriter, d time.Duration) {
	w.Header().Set("Retry-After", strconv.Itoa(int((d+time.Second-1)/time.Second)))
}
