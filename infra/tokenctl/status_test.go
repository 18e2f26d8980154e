package tokenctl

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

func TestStatusShowsRefreshTokenExpiry(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	toks := []domain.Connection{
		{Name: "known", Status: domain.StatusActive, Expiry: now.Add(time.Hour), ObtainedAt: now, Version: 3,
			RefreshExpiry: now.Add(90 * 24 * time.Hour)},
		{Name: "unknown", Status: domain.StatusActive, Expiry: now.Add(time.Hour), ObtainedAt: now, Version: 4},
	}
	var out strings.Builder
	p := &statusPrinter{w: &out, notice: 14 * 24 * time.Hour}
	for _, tok := range toks {
		p.print(tok, now)
	}
	p.flush()
	lines := strings.Split(out.String(), "\n")
	if !strings.Contains(lines[0], "REFRESH TOKEN EXPIRY  PROVIDER") || !strings.Contains(lines[1], " default ") ||
		!strings.Contains(lines[1], "2026-04-01T00:00:00Z") || !strings.Contains(lines[2], "unknown") {
		t.Errorf("status:\n%s", out.String())
	}
	// The columns before it keep their places (scripts read the version).
	version := regexp.MustCompile(`(?m)^\S+\s+\S+\s+\S+ \([^)]*\)\s+(\d+)\s`)
	if m := version.FindAllStringSubmatch(out.String(), -1); len(m) != 2 || m[0][1] != "3" || m[1][1] != "4" {
		t.Errorf("version column moved:\n%s", out.String())
	}
}

// streamingStore yields n tokens and, past the second block, checks that
// status has already written the first lines: it prints while it reads.
type streamingStore struct {
	Store  // the rest of the store: status uses none of it
	n      int
	out    *bytes.Buffer
	early  bool // output seen before the walk ended
	walked int
}

func (s *streamingStore) EachConnection(_ context.Context, fn func(domain.Connection) error) error {
	for i := range s.n {
		if i == 2*statusBlock+1 {
			s.early = strings.Contains(s.out.String(), "conn-00000 ")
		}
		s.walked++
		if err := fn(domain.Connection{Name: fmt.Sprintf("conn-%05d", i), Status: domain.StatusActive, Version: 1,
			Expiry: time.Now().Add(time.Hour)}); err != nil {
			return err
		}
	}
	return nil
}

type storeBackend struct {
	Backend // the rest of the backend: status uses none of it
	s       Store
}

func (b storeBackend) Open(context.Context) (*Stores, func(), error) {
	return &Stores{Connections: b.s}, func() {}, nil
}

func TestStatusStreams(t *testing.T) {
	var out, errOut bytes.Buffer
	s := &streamingStore{n: 3*statusBlock + 10, out: &out}
	if code := Main([]string{"status"}, storeBackend{s: s}, IO{Stdout: &out, Stderr: &errOut}); code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if !s.early {
		t.Error("nothing was printed before the last row was read: status buffers the table")
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != s.n+1 || !strings.HasPrefix(lines[0], "CONNECTION") || !strings.HasPrefix(lines[len(lines)-1], fmt.Sprintf("conn-%05d ", s.n-1)) {
		t.Errorf("%d lines (want %d), first %q, last %q", len(lines), s.n+1, lines[0], lines[len(lines)-1])
	}
}

func TestStatusWithoutConnections(t *testing.T) {
	var out bytes.Buffer
	if code := Main([]string{"status"}, storeBackend{s: &streamingStore{out: &out}}, IO{Stdout: &out, Stderr: &out}); code != exitOK || out.String() != "no connections\n" {
		t.Errorf("exit %d, output %q", code, out.String())
	}
}

// A failing connection shows as failing with the last answer's status and
// code; a refresh token dying within the notice shows in EXPIRING.
func TestStatusShowsFailingAndExpiring(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f := domain.RefreshFailure{Failures: 3, Since: now.Add(-time.Minute), HTTPStatus: 400, Code: "unrecognized_error", Failing: true}
	toks := []domain.Connection{
		{Name: "failing", Status: domain.StatusFailing, StatusReason: f.Describe(), Failure: f, Expiry: now.Add(time.Hour), ObtainedAt: now, Version: 3},
		{Name: "soon", Status: domain.StatusActive, Expiry: now.Add(time.Hour), ObtainedAt: now, Version: 4,
			RefreshExpiry: now.Add(13 * 24 * time.Hour)},
		{Name: "later", Status: domain.StatusActive, Expiry: now.Add(time.Hour), ObtainedAt: now, Version: 5,
			RefreshExpiry: now.Add(15 * 24 * time.Hour)},
	}
	var out strings.Builder
	p := &statusPrinter{w: &out, notice: 14 * 24 * time.Hour}
	for _, tok := range toks {
		p.print(tok, now)
	}
	p.flush()
	lines := strings.Split(out.String(), "\n")
	if !regexp.MustCompile(`PROVIDER +EXPIRING +REASON`).MatchString(lines[0]) ||
		!strings.Contains(lines[1], " failing ") || !strings.Contains(lines[1], "HTTP 400 unrecognized_error, 3 in a row") ||
		!strings.Contains(lines[2], " in 312h0m0s ") || strings.Contains(lines[3], "in 360h") {
		t.Errorf("status:\n%s", out.String())
	}
}
