package usecase_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/internal/testworld"
	"github.com/tokenguard/tokenguard/repository"
	"github.com/tokenguard/tokenguard/usecase"
)

type clockFunc func() time.Time

func (f clockFunc) Now() time.Time { return f() }

// A host whose clock is a minute behind (far more than the skew) decides
// staleness against the database server's clock: it refreshes the expired
// token instead of serving it. The control, on the host's own clock, serves
// it and the API answers 401.
func TestHostClockBehindByMoreThanTheSkew(t *testing.T) {
	behind := clockFunc(func() time.Time { return time.Now().Add(-time.Minute) })
	for _, tc := range []struct {
		name   string
		clock  func(t *testing.T, s *testworld.Stack) usecase.Clock
		status int
	}{
		{"database clock", func(t *testing.T, s *testworld.Stack) usecase.Clock {
			c, err := repository.NewDatabaseClock(context.Background(), s.DB, behind)
			if err != nil {
				t.Fatal(err)
			}
			if off := c.Offset(); off < 59*time.Second || off > 61*time.Second {
				t.Fatalf("measured offset %v, want about 1m", off)
			}
			return c
		}, http.StatusOK},
		{"host clock (control)", func(*testing.T, *testworld.Stack) usecase.Clock { return behind }, http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := testworld.New(t, 2*time.Second)
			a := w.Stack(t, usecase.Options{Skew: 500 * time.Millisecond})
			w.Connect(t, a)
			probe := w.Stack(t, usecase.Options{})
			b := w.Stack(t, usecase.Options{Skew: 500 * time.Millisecond, Clock: tc.clock(t, probe)})
			time.Sleep(2500 * time.Millisecond) // the token has expired for real
			tok, err := b.UC.Token(context.Background(), conn)
			if err != nil {
				t.Fatal(err)
			}
			if got := w.CallResource(t, tok.AccessToken.Reveal()); got != tc.status {
				t.Errorf("API answered %d with the token served (version %d), want %d", got, tok.Version, tc.status)
			}
		})
	}
}
