package sandbox

import (
	"cmp"
	"slices"
	"sync"
	"time"
)

// Timeline is what the provider saw over time, for pictures of a run (the
// demo's HTML report). It holds no token and no grant identifier: grants
// are numbered in the order the provider first refreshed them.
type Timeline struct {
	// Refreshes are the successful refresh_token grants, in order.
	Refreshes []RefreshRecord `json:"refreshes"`
	// Resource counts /resource calls per second and User-Agent product,
	// ordered by second then agent.
	Resource []ResourceSecond `json:"resource"`
	// Dropped counts refreshes not recorded because the timeline was full
	// (maxTimelineRefreshes); they are still in Stats.
	Dropped int64 `json:"dropped,omitempty"`
}

// RefreshRecord is one successful refresh.
type RefreshRecord struct {
	At       time.Time `json:"at"`
	Agent    string    `json:"agent"`    // User-Agent product of the token request ("unknown" if none)
	Grant    int       `json:"grant"`    // 1 for the first grant refreshed, 2 for the next...
	Rotation int       `json:"rotation"` // 1 for the grant's first refresh, 2 for the next...
}

// ResourceSecond counts one agent's /resource calls in one second.
type ResourceSecond struct {
	Second       time.Time `json:"second"` // UTC, truncated to the second
	Agent        string    `json:"agent"`
	OK           int64     `json:"ok"`
	Unauthorized int64     `json:"unauthorized"` // answered 401
}

// maxTimelineRefreshes bounds the memory a long-lived sandbox spends on
// the timeline (benchmarks refresh many thousand times).
const maxTimelineRefreshes = 100_000

type timeline struct {
	mu        sync.Mutex
	refreshes []RefreshRecord
	dropped   int64
	grants    map[string]*grantSeq // grant family id -> its number and rotations
	seconds   map[secondKey]*ResourceSecond
}

type grantSeq struct{ n, rotations int }

type secondKey struct {
	unix  int64
	agent string
}

func (t *timeline) reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.refreshes, t.dropped = nil, 0
	t.grants = map[string]*grantSeq{}
	t.seconds = map[secondKey]*ResourceSecond{}
}

func (t *timeline) refreshed(at time.Time, userAgent, grantID string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	g, ok := t.grants[grantID]
	if !ok {
		g = &grantSeq{n: len(t.grants) + 1}
		t.grants[grantID] = g
	}
	g.rotations++
	if len(t.refreshes) >= maxTimelineRefreshes {
		t.dropped++
		return
	}
	t.refreshes = append(t.refreshes, RefreshRecord{At: at.UTC(), Agent: agentProduct(userAgent), Grant: g.n, Rotation: g.rotations})
}

func (t *timeline) resource(at time.Time, userAgent string, ok bool) {
	k := secondKey{unix: at.Unix(), agent: agentProduct(userAgent)}
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.seconds[k]
	if s == nil {
		s = &ResourceSecond{Second: time.Unix(k.unix, 0).UTC(), Agent: k.agent}
		t.seconds[k] = s
	}
	if ok {
		s.OK++
	} else {
		s.Unauthorized++
	}
}

// Timeline returns a copy of what the provider saw since it started (or
// since ResetStats). It is safe to call while requests are in flight.
func (p *Provider) Timeline() Timeline {
	t := &p.timeline
	t.mu.Lock()
	defer t.mu.Unlock()
	out := Timeline{Refreshes: slices.Clone(t.refreshes), Dropped: t.dropped}
	for _, s := range t.seconds {
		out.Resource = append(out.Resource, *s)
	}
	slices.SortFunc(out.Resource, func(a, b ResourceSecond) int {
		return cmp.Or(a.Second.Compare(b.Second), cmp.Compare(a.Agent, b.Agent))
	})
	return out
}
