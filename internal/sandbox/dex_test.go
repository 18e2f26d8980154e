package sandbox

import (
	"testing"
	"time"
)

// In Dex's shape, a dead or rotated-away refresh token is answered 400
// invalid_request with Dex's description; within the reuse interval a
// rotated one is answered again, without a new rotation.
func TestDexShape(t *testing.T) {
	e := newEnv(t, Dex(Options{}))
	tok := e.grant(t)
	tokenURL := e.cfg.Endpoint.TokenURL
	status, first := e.post(t, tokenURL, tok.RefreshToken)
	if status != 200 || first["refresh_token"] == nil {
		t.Fatalf("refresh: %d %v", status, first)
	}
	status, again := e.post(t, tokenURL, tok.RefreshToken)
	if status != 200 || again["refresh_token"] != first["refresh_token"] || e.p.Stats().GraceReplays != 1 {
		t.Fatalf("reuse within %v: %d, same answer %v, replays %d", DexReuseInterval, status,
			again["refresh_token"] == first["refresh_token"], e.p.Stats().GraceReplays)
	}
	e.p.RevokeAll()
	status, body := e.post(t, tokenURL, first["refresh_token"].(string))
	if status != 400 || body["error"] != "invalid_request" || body["error_description"] != DexDeadGrant.Description {
		t.Fatalf("revoked grant: %d %v, want Dex's 400 invalid_request", status, body)
	}
	if status, body := e.post(t, tokenURL, "made-up"); status != 400 || body["error"] != "invalid_request" {
		t.Fatalf("unknown refresh token: %d %v, want 400 invalid_request", status, body)
	}
}

// Beyond TokenRate a second the token endpoint answers 429 with
// Retry-After; the control, no limit, answers every request.
func TestTokenRate(t *testing.T) {
	for _, rate := range []int{3, 0} {
		e := newEnv(t, Options{TokenRate: rate})
		limited := 0
		start := time.Now()
		for range 10 {
			if status, _ := e.post(t, e.cfg.Endpoint.TokenURL, "made-up"); status == 429 {
				limited++
			}
		}
		if rate == 0 && limited != 0 {
			t.Errorf("no limit: %d answered 429", limited)
		}
		// 10 requests within a second at 3 a second: at least 6 refused.
		if rate > 0 && time.Since(start) < time.Second && (limited < 6 || e.p.Stats().RateLimited != int64(limited)) {
			t.Errorf("rate %d/s: %d of 10 answered 429 (counted %d)", rate, limited, e.p.Stats().RateLimited)
		}
	}
}
