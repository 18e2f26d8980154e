package domain

import (
	"errors"
	"testing"
	"time"
)

func TestParseTokenRate(t *testing.T) {
	for in, want := range map[string]TokenRate{
		"20/1s":     {20, time.Second},
		"100/1m":    {100, time.Minute},
		"10/10m":    {10, 10 * time.Minute},
		" 5/250ms ": {5, 250 * time.Millisecond},
		"":          {},
	} {
		got, err := ParseTokenRate(in)
		if err != nil || got != want {
			t.Errorf("ParseTokenRate(%q) = %v, %v; want %v", in, got, err, want)
		}
		if in != "" && in[0] != ' ' && got.String() != in {
			t.Errorf("%v.String() = %q, want %q", got, got.String(), in)
		}
	}
	for _, in := range []string{"20", "20/", "/1s", "0/1s", "-1/1s", "x/1s", "20/1", "20/0s", "20/-1s", "20/1us",
		"10001/1s", "20/1s/2", "1.5/1s"} {
		if r, err := ParseTokenRate(in); !errors.Is(err, ErrInvalidTokenRate) {
			t.Errorf("ParseTokenRate(%q) = %v, %v; want ErrInvalidTokenRate", in, r, err)
		}
	}
	if err := (TokenRate{Limit: 0, Period: time.Second}).Validate(); !errors.Is(err, ErrInvalidTokenRate) {
		t.Errorf("0/1s validates: %v", err)
	}
}
