package tokenctl

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// FuzzReadGrant: whatever arrives on stdin, reading it never panics, a
// grant it accepts has both tokens, and an error never repeats a value it
// was given (a pasted token must not reach the terminal or a log).
func FuzzReadGrant(f *testing.F) {
	f.Add([]byte(`{"access_token":"a","token_type":"Bearer","refresh_token":"r","expiry":"2030-01-01T00:00:00Z"}`), "at-123456789", "rt-123456789", "2030-01-01T00:00:00Z")
	f.Add([]byte(`{"access_token": "a",`), "", "", "")
	f.Add([]byte(`["a"]`), "x", "y", "not-a-time-but-a-token-value")
	f.Add([]byte(`{"expires_in": 3600}{}`), "at", "", "soon")
	f.Add([]byte{}, "a", "b", "c")
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, raw []byte, at, rt, exp string) {
		// Raw input: no panic; an accepted grant has both tokens.
		if g, err := readGrant(bytes.NewReader(raw), now); err == nil && (g.AccessToken.IsZero() || g.RefreshToken.IsZero()) {
			t.Fatalf("accepted a grant without tokens from %q", raw)
		}
		// Well-formed JSON carrying the fuzzed values: an error must not
		// echo any of them.
		doc, _ := json.Marshal(map[string]any{"access_token": at, "refresh_token": rt, "expiry": exp})
		_, err := readGrant(bytes.NewReader(doc), now)
		if err == nil {
			return
		}
		for _, v := range []string{at, rt, exp} {
			if len(v) >= 8 && strings.Contains(err.Error(), v) {
				t.Fatalf("error %q repeats an input value", err)
			}
		}
	})
}
