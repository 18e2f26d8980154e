package usecase

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// budgets remembers, per provider, until when its fleet-wide token budget
// was found spent, so callers with a still-valid token are served it
// without asking the store again meanwhile.
type budgets struct {
	mu    sync.Mutex
	until map[string]time.Time
}

// spent records that provider's budget allows no request before until.
func (b *budgets) spent(provider string, until time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.until == nil {
		b.until = map[string]time.Time{}
	}
	if until.After(b.until[provider]) {
		b.until[provider] = until
	}
}

// wait is how long provider's budget is still known to be spent at now.
func (b *budgets) wait(provider string, now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return max(b.until[provider].Sub(now), 0)
}

// budgetSpent is the error of a refresh the provider's token budget
// refused for wait.
func budgetSpent(wait time.Duration) error {
	return fmt.Errorf("%w (for %v)", domain.ErrTokenBudgetSpent, wait.Round(time.Millisecond))
}

// shrinkOn429 spends provider's fleet-wide token budget for as long as its
// 429 said to wait (Retry-After), if the store and provider have budgets.
func (u *RefreshTokenUseCase) shrinkOn429(ctx context.Context, provider string, err error) {
	var pe *domain.ProviderError
	if !errors.As(err, &pe) || pe.HTTPStatus != 429 || pe.RetryAfter <= 0 {
		return
	}
	s, ok := u.store.(BudgetShrinker)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, u.opts.WriteTimeout)
	defer cancel()
	budgeted, err := s.ShrinkBudget(ctx, provider, pe.RetryAfter)
	if err != nil {
		u.opts.Logger.Warn("could not shrink the provider's token budget after its 429", "provider", provider, "err", err)
	}
	if budgeted {
		u.budgets.spent(provider, u.opts.Clock.Now().Add(pe.RetryAfter))
	}
}

// queuedLimit bounds the claims a provider's queue has racing at once.
const queuedLimit = 4

// queue holds, per provider, the refreshes its spent budget held back
// while their tokens were still valid; one goroutine per provider redeems
// them as the budget allows, soonest expiry first, whoever calls meanwhile.
type queue struct {
	mu      sync.Mutex
	waiting map[string]*byExpiry // provider -> its held-back refreshes, while its goroutine runs
}

// byExpiry is a heap of tokens, soonest expiry first, one per connection.
type byExpiry struct {
	toks []domain.Token
	at   map[string]int // connection -> index in toks
}

func (h *byExpiry) Len() int           { return len(h.toks) }
func (h *byExpiry) Less(i, j int) bool { return h.toks[i].Expiry.Before(h.toks[j].Expiry) }
func (h *byExpiry) Swap(i, j int) {
	h.toks[i], h.toks[j] = h.toks[j], h.toks[i]
	h.at[h.toks[i].Connection], h.at[h.toks[j].Connection] = i, j
}
func (h *byExpiry) Push(x any) {
	t := x.(domain.Token)
	h.at[t.Connection] = len(h.toks)
	h.toks = append(h.toks, t)
}
func (h *byExpiry) Pop() any {
	t := h.toks[len(h.toks)-1]
	h.toks = h.toks[:len(h.toks)-1]
	delete(h.at, t.Connection)
	return t
}

// push queues t's refresh (the last seen token of a connection wins), and
// reports whether the provider's goroutine must be started.
func (q *queue) push(t domain.Token) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.waiting == nil {
		q.waiting = map[string]*byExpiry{}
	}
	h := q.waiting[t.Provider]
	start := h == nil
	if start {
		h = &byExpiry{at: map[string]int{}}
		q.waiting[t.Provider] = h
	}
	if i, ok := h.at[t.Connection]; ok {
		h.toks[i] = t
		heap.Fix(h, i)
	} else {
		heap.Push(h, t)
	}
	return start
}

// pop takes the queued token of provider that expires first; false (and
// the provider's goroutine ends) when there is none.
func (q *queue) pop(provider string) (domain.Token, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	h := q.waiting[provider]
	if h == nil || h.Len() == 0 {
		delete(q.waiting, provider)
		return domain.Token{}, false
	}
	return heap.Pop(h).(domain.Token), true
}

// hold queues t's refresh and starts its provider's goroutine if needed.
func (u *RefreshTokenUseCase) hold(t domain.Token) {
	if u.queued.push(t) {
		go u.drainQueue(t.Provider)
	}
}

// drainQueue refreshes provider's queued tokens as the budget allows. One
// the budget refused again is queued again; one that failed otherwise is
// left to the next caller.
func (u *RefreshTokenUseCase) drainQueue(provider string) {
	sem := make(chan struct{}, queuedLimit)
	for {
		if w := u.budgets.wait(provider, u.opts.Clock.Now()); w > 0 {
			time.Sleep(w)
			continue
		}
		t, ok := u.queued.pop(provider)
		if !ok {
			return
		}
		if !usable(t, u.opts.Clock.Now()) || !u.stale(t) {
			continue // expired: its callers wait for the budget themselves
		}
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), u.opts.LockWait+u.opts.AnswerDeadline)
			defer cancel()
			out, err := u.refresh(ctx, t.Connection, false, u.stale, t)
			if err == nil && out.Version == t.Version && u.budgets.wait(provider, u.opts.Clock.Now()) > 0 && usable(out, u.opts.Clock.Now()) {
				u.hold(out)
			}
		}()
	}
}
