package di

import (
	"errors"
	"strings"
	"testing"

	"github.com/tokenguard/tokenguard/domain"
)

// OAUTH_TOKEN_RATE is read as N/PERIOD; anything else is refused naming
// the variable, with the typed error.
func TestConfigTokenRate(t *testing.T) {
	base := []string{"DATABASE_URL=postgres://u:pw@db/x", "OAUTH_TOKEN_URL=https://p/token", "OAUTH_CLIENT_ID=id"}
	c, err := ConfigFromEnv(append(base, "OAUTH_TOKEN_RATE=20/1s"))
	if err != nil || c.OAuth.TokenRate != "20/1s" {
		t.Fatalf("20/1s: %q, %v", c.OAuth.TokenRate, err)
	}
	for _, bad := range []string{"20", "20/s", "0/1s"} {
		_, err := ConfigFromEnv(append(base, "OAUTH_TOKEN_RATE="+bad))
		if !errors.Is(err, domain.ErrInvalidTokenRate) || !strings.Contains(err.Error(), "OAUTH_TOKEN_RATE") {
			t.Errorf("OAUTH_TOKEN_RATE=%s: %v", bad, err)
		}
	}
}
