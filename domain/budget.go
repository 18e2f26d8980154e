package domain

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// TokenRate is a provider's deployment-wide budget: at most Limit token requests in any Period; zero: none.
type TokenRate struct {
	Limit  int
	Period time.Duration
}

// IsZero reports whether r sets no budget.
func (r TokenRate) IsZero() bool { return r.Limit == 0 }

// String is r as ParseTokenRate reads it ("" for no budget).
func (r TokenRate) String() string {
	if r.IsZero() {
		return ""
	}
	p := r.Period.String()
	for _, zero := range []string{"m0s", "h0m"} { // without its zero units: 1m, not 1m0s
		if strings.HasSuffix(p, zero) {
			p = p[:len(p)-2]
		}
	}
	return strconv.Itoa(r.Limit) + "/" + p
}

// MaxTokenRateLimit bounds N in N/PERIOD: the budget keeps the time of every request of the last period.
const MaxTokenRateLimit = 10000

// ErrInvalidTokenRate: a token budget is not N/PERIOD, 1 <= N <= MaxTokenRateLimit, PERIOD >= 1ms.
var ErrInvalidTokenRate = errors.New("invalid token rate (want N/PERIOD, e.g. 20/1s, 100/1m, 10/10m)")

// ParseTokenRate reads N/PERIOD ("20/1s", "100/1m", "10/10m"); "" is no budget.
func ParseTokenRate(s string) (TokenRate, error) {
	if s == "" {
		return TokenRate{}, nil
	}
	n, p, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return TokenRate{}, fmt.Errorf("%w: %q has no /", ErrInvalidTokenRate, s)
	}
	limit, err := strconv.Atoi(n)
	if err != nil || limit < 1 || limit > MaxTokenRateLimit {
		return TokenRate{}, fmt.Errorf("%w: %q: N must be a whole number from 1 to %d", ErrInvalidTokenRate, s, MaxTokenRateLimit)
	}
	period, err := time.ParseDuration(p)
	if err != nil || period < time.Millisecond {
		return TokenRate{}, fmt.Errorf("%w: %q: PERIOD must be a duration of at least 1ms", ErrInvalidTokenRate, s)
	}
	return TokenRate{Limit: limit, Period: period}, nil
}

// Validate checks r as ParseTokenRate would; the zero TokenRate is valid.
func (r TokenRate) Validate() error {
	if r == (TokenRate{}) {
		return nil
	}
	if r.Limit < 1 || r.Limit > MaxTokenRateLimit || r.Period < time.Millisecond {
		return fmt.Errorf("%w: %d/%v", ErrInvalidTokenRate, r.Limit, r.Period)
	}
	return nil
}

// ErrTokenBudgetSpent: the provider's token budget is spent for now; the refresh was not
// attempted and no grant was touched. A caller whose token is still valid is served it.
var ErrTokenBudgetSpent = errors.New("the provider's token budget is spent for now")
