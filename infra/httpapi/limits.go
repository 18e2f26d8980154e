package httpapi

import (
	"context"
	"maps"
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// addrLimits bound the public routes per client address (the TCP peer):
// a token bucket and requests at once, plus a cap across all addresses.
type addrLimits struct {
	rate     rate.Limit
	burst    int
	inFlight int
	total    chan struct{}

	mu    sync.Mutex
	addrs map[string]*addrState
}

type addrState struct {
	lim      *rate.Limiter
	inFlight int
	seen     time.Time
}

const maxAddrs = 4096 // addresses remembered

func newAddrLimits(e Edges) *addrLimits {
	r := positive(e.PublicRate, 20)
	return &addrLimits{rate: r, burst: positive(e.PublicBurst, int(2*r)), inFlight: positive(e.PublicInFlight, 4),
		total: make(chan struct{}, positive(e.PublicTotal, 64)), addrs: map[string]*addrState{}}
}

// positive is v, or def for a setting left 0.
func positive[T ~int | ~int64 | ~float64](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

func (a *addrLimits) acquire(addr string) (release func(), wait time.Duration, ok bool) {
	now := time.Now()
	a.mu.Lock()
	st, found := a.addrs[addr]
	if !found {
		if len(a.addrs) >= maxAddrs {
			a.forget(now)
		}
		st = &addrState{lim: rate.NewLimiter(a.rate, a.burst)}
		a.addrs[addr] = st
	}
	st.seen = now
	if st.inFlight >= a.inFlight {
		a.mu.Unlock()
		return nil, time.Second, false
	}
	if d := take(st.lim, now); d > 0 {
		a.mu.Unlock()
		return nil, d, false
	}
	st.inFlight++
	a.mu.Unlock()
	select {
	case a.total <- struct{}{}:
	default:
		a.done(st)
		return nil, time.Second, false
	}
	return func() { <-a.total; a.done(st) }, 0, true
}

func (a *addrLimits) done(st *addrState) {
	a.mu.Lock()
	st.inFlight--
	a.mu.Unlock()
}

// forget drops idle addresses, those unseen for a minute first; mu held.
func (a *addrLimits) forget(now time.Time) {
	maps.DeleteFunc(a.addrs, func(_ string, st *addrState) bool {
		return st.inFlight == 0 && now.Sub(st.seen) > time.Minute
	})
	if len(a.addrs) >= maxAddrs {
		maps.DeleteFunc(a.addrs, func(_ string, st *addrState) bool { return st.inFlight == 0 })
	}
}

// limit answers 429 (refuse, or nil: JSON) to an address over its limits.
func (a *addrLimits) limit(next http.Handler, refuse http.HandlerFunc) http.Handler {
	if refuse == nil {
		refuse = func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, http.StatusTooManyRequests, errorBody{Error: "too many requests from this address; try again later", Code: "rate_limited"})
		}
	}
	if ControlBuild {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		addr, _, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			addr = r.RemoteAddr
		}
		release, wait, ok := a.acquire(addr)
		if !ok {
			setRetryAfter(w, wait)
			refuse(w, r)
			return
		}
		defer release()
		next.ServeHTTP(w, r)
	})
}

type health struct {
	mu  sync.Mutex
	at  time.Time
	err error
}

// check pings db unless the last ping is under a second old; callers wait
// for a ping in progress.
func (h *health) check(ctx context.Context, db Pinger) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !ControlBuild && !h.at.IsZero() && time.Since(h.at) < time.Second {
		return h.err
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	h.err = db.PingContext(pctx)
	h.at = time.Now()
	return h.err
}
