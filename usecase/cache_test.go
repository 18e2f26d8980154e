package usecase

import (
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

func cached(version int64) domain.Token {
	return domain.Token{
		Connection: "acme", AccessToken: domain.NewSecret("at"), Version: version, Status: domain.StatusActive,
		ObtainedAt: time.Unix(0, 0), Expiry: time.Unix(3600, 0),
	}
}

var at = time.Unix(60, 0)

// len is how many connections have a slot.
func (c *tokenCache) len() int { return int(c.size.Load()) }

func TestCacheServesOnlyWhileTrusted(t *testing.T) {
	var c tokenCache
	c.put(cached(1), c.begin(), 0)
	if _, ok := c.get("acme", at); ok == hit {
		t.Fatal("served without a listener vouching for it")
	}
	c.setTrusted(true)
	c.put(cached(1), c.begin(), 0)
	if tok, ok := c.get("acme", at); ok != hit || tok.tok.Version != 1 {
		t.Fatalf("get = %v, %v", tok.tok.Version, ok)
	}
	c.put(cached(1), c.begin(), 30*time.Second)
	if _, ok := c.get("acme", time.Unix(3571, 0)); ok != stale {
		t.Error("served a token inside the skew")
	}
	if _, ok := c.get("acme", time.Unix(3569, 0)); ok != hit {
		t.Error("did not serve a token outside the skew")
	}
	c.setTrusted(false)
	if _, ok := c.get("acme", at); ok == hit {
		t.Error("served after the listener was lost")
	}
	c.setTrusted(true)
	if _, ok := c.get("acme", at); ok == hit {
		t.Error("served a token cached before a gap in the change feed")
	}
}

func TestCacheInvalidation(t *testing.T) {
	var c tokenCache
	c.setTrusted(true)
	c.put(cached(1), c.begin(), 0)
	c.invalidate("acme", 2)
	if _, ok := c.get("acme", at); ok == hit {
		t.Fatal("served a superseded token")
	}
	// A read that started before the change and returns the old version
	// must not put it back.
	c.put(cached(1), c.begin(), 0)
	if _, ok := c.get("acme", at); ok == hit {
		t.Fatal("an old read re-cached a superseded token")
	}
	c.put(cached(2), c.begin(), 0)
	if tok, ok := c.get("acme", at); ok != hit || tok.tok.Version != 2 {
		t.Fatalf("new version not cached: %v %v", tok.tok.Version, ok)
	}
	// Our own change announced back to us keeps the entry.
	c.invalidate("acme", 2)
	if _, ok := c.get("acme", at); ok != hit {
		t.Error("an announcement of the cached version dropped it")
	}
	// Never back to an older version.
	c.put(cached(1), c.begin(), 0)
	if tok, _ := c.get("acme", at); tok.tok.Version != 2 {
		t.Errorf("went back to version %d", tok.tok.Version)
	}
	// A read that began in an earlier epoch is not cached.
	epoch := c.begin()
	c.setTrusted(false)
	c.setTrusted(true)
	c.put(cached(3), epoch, 0)
	if _, ok := c.get("acme", at); ok == hit {
		t.Error("cached a read from before a reconnect")
	}
	// Connections needing re-authorisation are never cached.
	bad := cached(4)
	bad.Status = domain.StatusNeedsReauth
	c.put(bad, c.begin(), 0)
	if _, ok := c.get("acme", at); ok == hit {
		t.Error("cached a needs_reauth token")
	}
}

func TestCacheHotPathDoesNotAllocate(t *testing.T) {
	var c tokenCache
	c.setTrusted(true)
	c.put(cached(1), c.begin(), 0)
	if n := testing.AllocsPerRun(1000, func() { _, _ = c.get("acme", at) }); n != 0 {
		t.Errorf("get allocates %v times", n)
	}
}

func tokenOf(id string, version int64) domain.Token {
	t := cached(version)
	t.Connection = id
	t.RefreshToken = domain.NewSecret("rt-" + id)
	return t
}

// The cache holds at most its capacity; connections hit since the last
// sweep survive it, and a change announced for a connection without a slot
// allocates none.
func TestCacheIsBoundedAndKeepsHotConnections(t *testing.T) {
	c := tokenCache{capacity: 1000}
	c.setTrusted(true)
	hot := []string{"hot-1", "hot-2", "hot-3"}
	for _, id := range hot {
		c.put(tokenOf(id, 1), c.begin(), 0)
	}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	start := heap()
	for i := range 50_000 {
		c.put(tokenOf("cold-"+strconv.Itoa(i), 1), c.begin(), 0)
		for _, id := range hot {
			if _, ok := c.get(id, at); ok != hit {
				t.Fatalf("hot connection %s evicted after %d cold ones", id, i)
			}
		}
		if n := c.len(); n > 1000 {
			t.Fatalf("cache holds %d connections, capacity 1000", n)
		}
	}
	// 1,000 entries of about 0.5 KB; unbounded, the 50,000 would take 25 MB.
	if grew := int64(heap()) - int64(start); grew > 2<<20 {
		t.Errorf("heap grew by %d KB for a cache of 1,000 connections, bound 2048 KB", grew>>10)
	}
	before := c.len()
	for i := range 10_000 {
		c.invalidate("never-seen-"+strconv.Itoa(i), 5)
	}
	if c.len() != before {
		t.Errorf("announcements for unknown connections added %d slots", c.len()-before)
	}
	if s, ok := c.get("hot-1", at); ok != hit || !s.tok.RefreshToken.IsZero() {
		t.Errorf("hot-1: %v, refresh token cached: %v", ok, !s.tok.RefreshToken.IsZero())
	}
}

// A read that began before a change was announced for a connection the
// cache had no slot for (or before its slot was evicted) is not cached: it
// may hold the superseded token.
func TestCacheRefusesAReadOlderThanASlotlessAnnouncement(t *testing.T) {
	var c tokenCache
	c.setTrusted(true)
	m := c.begin()
	c.invalidate("acme", 2) // no slot: nothing allocated
	c.put(cached(1), m, 0)
	if _, ok := c.get("acme", at); ok == hit {
		t.Fatal("cached a read that began before version 2 was announced")
	}
	c.put(cached(2), c.begin(), 0)
	if s, ok := c.get("acme", at); ok != hit || s.tok.Version != 2 {
		t.Fatalf("a read after the announcement was not cached: %v", ok)
	}
}

// A token without expiry stays in the cache for untimedTTL, then is read
// again (a miss, not a refresh).
func TestCacheBoundsTokensWithoutExpiry(t *testing.T) {
	now := time.Unix(1000, 0)
	c := tokenCache{clock: clockAt(func() time.Time { return now })}
	c.setTrusted(true)
	tok := cached(1)
	tok.Expiry = time.Time{}
	c.put(tok, c.begin(), 0)
	if _, ok := c.get("acme", now.Add(untimedTTL-time.Second)); ok != hit {
		t.Fatal("not served within its bound")
	}
	if _, ok := c.get("acme", now.Add(untimedTTL+time.Second)); ok != miss {
		t.Fatalf("after its bound: %v, want a miss (read again, not refresh)", ok)
	}
}

type clockAt func() time.Time

func (f clockAt) Now() time.Time { return f() }
