package usecase

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// pagedAhead serves n due connections a page at a time and counts what the
// sweep asked for.
type pagedAhead struct {
	n       int
	lockErr error // TryInLock's answer; nil: the lock is taken (skipped)

	mu       sync.Mutex
	pages    int
	maxLimit int
	tried    map[string]bool
}

func (p *pagedAhead) ExpiringBefore(_ context.Context, _ time.Time, after string, limit int) ([]string, string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pages++
	p.maxLimit = max(p.maxLimit, limit)
	from := 0
	if after != "" {
		from, _ = strconv.Atoi(after)
	}
	var names []string
	for i := from; i < p.n && len(names) < limit; i++ {
		names = append(names, fmt.Sprintf("c-%d", i))
	}
	next := ""
	if len(names) == limit {
		next = strconv.Itoa(from + limit)
	}
	return names, next, nil
}

func (p *pagedAhead) ObtainedBefore(ctx context.Context, t time.Time, after string, limit int) ([]string, string, error) {
	return p.ExpiringBefore(ctx, t, after, limit)
}

func (p *pagedAhead) TryInLock(_ context.Context, id string, _ time.Duration, _ func(context.Context, LockedStore) error) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tried[id] {
		return false, fmt.Errorf("%s tried twice", id)
	}
	p.tried[id] = true
	return p.lockErr != nil, p.lockErr
}

func TestRefreshAheadPagesThroughEveryDueConnection(t *testing.T) {
	u, err := NewRefreshTokenUseCase(nil, nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	const n = 2*sweepPage + 7
	p := &pagedAhead{n: n, tried: map[string]bool{}}
	rep, err := u.RefreshAhead(context.Background(), p, time.Minute, 8)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Due != n || rep.Skipped != n || len(p.tried) != n || p.pages != 3 || p.maxLimit != sweepPage {
		t.Fatalf("report %+v, tried %d, pages %d (limit %d); want %d skipped over 3 pages of %d", rep, len(p.tried), p.pages, p.maxLimit, n, sweepPage)
	}
	// The keep-alive sweep pages the same way.
	p = &pagedAhead{n: n, tried: map[string]bool{}}
	if rep, err = u.KeepAlive(context.Background(), p, time.Hour, 8); err != nil || rep.Due != n || len(p.tried) != n || p.pages != 3 {
		t.Fatalf("keep alive: report %+v, %v, tried %d over %d pages", rep, err, len(p.tried), p.pages)
	}
}

func TestRefreshAheadReturnsAFewErrorsAndCountsTheRest(t *testing.T) {
	u, err := NewRefreshTokenUseCase(nil, nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	const n = sweepPage + 1
	boom := errors.New("database went away")
	p := &pagedAhead{n: n, tried: map[string]bool{}, lockErr: boom}
	rep, err := u.RefreshAhead(context.Background(), p, time.Minute, 4)
	if rep.Failed != n || !errors.Is(err, boom) {
		t.Fatalf("report %+v, err %v", rep, err)
	}
	if got := strings.Count(err.Error(), boom.Error()); got != sweepErrors {
		t.Errorf("%d errors spelled out, want %d", got, sweepErrors)
	}
	if !strings.Contains(err.Error(), fmt.Sprintf("and %d more", n-sweepErrors)) {
		t.Errorf("error does not count the rest: %.200s", err)
	}
}
