package usecase

import (
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

func cached(version int64) domain.Token {
	return domain.Token{
		ConnectionID: "acme", AccessToken: domain.NewSecret("at"), Version: version, Status: domain.StatusActive,
		ObtainedAt: time.Unix(0, 0), Expiry: time.Unix(3600, 0),
	}
}

var at = time.Unix(60, 0)

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
