package usecase

import (
	"container/heap"
	"context"
	"errors"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// shrinkOn429 spends provider's fleet-wide token budget for its 429's Retry-After, if budgeted.
func (u *RefreshTokenUseCase) shrinkOn429(ctx context.Context, provider string, err error) {
	var pe *domain.ProviderError
	s, ok := u.store.(BudgetShrinker)
	if !ok || !errors.As(err, &pe) || pe.HTTPStatus != 429 || pe.RetryAfter <= 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, u.opts.WriteTimeout)
	defer cancel()
	budgeted, err := s.ShrinkBudget(ctx, provider, pe.RetryAfter)
	if err != nil {
		u.opts.Logger.Warn("could not shrink the provider's token budget after its 429", "provider", provider, "err", err)
	}
	if budgeted {
		u.provider(provider).spent(u.opts.Clock.Now().Add(pe.RetryAfter))
	}
}

// queuedLimit bounds the claims a provider's queue has racing at once.
const queuedLimit = 4

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

// push queues t's refresh (a connection's last seen token wins); true: start drainQueue.
func (p *providerState) push(t domain.Token) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	start := p.queued == nil
	if start {
		p.queued = &byExpiry{at: map[string]int{}}
	}
	if i, ok := p.queued.at[t.Connection]; ok {
		p.queued.toks[i] = t
		heap.Fix(p.queued, i)
	} else {
		heap.Push(p.queued, t)
	}
	return start
}

// pop takes the queued token that expires first; false, and drainQueue ends, when there is none.
func (p *providerState) pop() (domain.Token, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.queued == nil || p.queued.Len() == 0 {
		p.queued = nil
		return domain.Token{}, false
	}
	return heap.Pop(p.queued).(domain.Token), true
}

// hold queues t's refresh, one goroutine per provider redeeming the queue as the budget allows,
// soonest expiry first, whoever calls meanwhile.
func (u *RefreshTokenUseCase) hold(t domain.Token) {
	if p := u.provider(t.Provider); p.push(t) {
		go u.drainQueue(p)
	}
}

// drainQueue refreshes p's queued tokens as the budget allows. One the budget refused again is
// queued again; one that failed otherwise is left to the next caller.
func (u *RefreshTokenUseCase) drainQueue(p *providerState) {
	sem := make(chan struct{}, queuedLimit)
	for {
		if w := p.budgetWait(u.opts.Clock.Now()); w > 0 {
			time.Sleep(w)
			continue
		}
		t, ok := p.pop()
		if !ok {
			return
		}
		if !usable(t, u.opts.Clock.Now()) || !u.stale(t) {
			continue // expired: its callers wait for the budget themselves
		}
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), u.opts.LockWait+u.opts.callWindow())
			defer cancel()
			out, err := u.refresh(ctx, t.Connection, false, u.stale, t)
			if err == nil && out.Version == t.Version && p.budgetWait(u.opts.Clock.Now()) > 0 && usable(out, u.opts.Clock.Now()) {
				u.hold(out)
			}
		}()
	}
}
