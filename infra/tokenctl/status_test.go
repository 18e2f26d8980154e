package tokenctl

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

func TestStatusShowsRefreshTokenExpiry(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	toks := []domain.Token{
		{ConnectionID: "known", Status: domain.StatusActive, Expiry: now.Add(time.Hour), ObtainedAt: now, Version: 3,
			RefreshExpiry: now.Add(90 * 24 * time.Hour), RefreshToken: domain.NewSecret("rt-secret")},
		{ConnectionID: "unknown", Status: domain.StatusActive, Expiry: now.Add(time.Hour), ObtainedAt: now, Version: 4},
	}
	var out strings.Builder
	printStatus(&out, toks, now)
	lines := strings.Split(out.String(), "\n")
	if !strings.Contains(lines[0], "REFRESH TOKEN EXPIRY") ||
		!strings.Contains(lines[1], "2026-04-01T00:00:00Z") || !strings.Contains(lines[2], "unknown") {
		t.Errorf("status:\n%s", out.String())
	}
	// The columns before it keep their places (scripts read the version).
	version := regexp.MustCompile(`(?m)^\S+\s+\S+\s+\S+ \([^)]*\)\s+(\d+)\s`)
	if m := version.FindAllStringSubmatch(out.String(), -1); len(m) != 2 || m[0][1] != "3" || m[1][1] != "4" {
		t.Errorf("version column moved:\n%s", out.String())
	}
	if strings.Contains(out.String(), "rt-secret") {
		t.Errorf("status shows a refresh token:\n%s", out.String())
	}
}
