package usecase

import (
	"context"
	"fmt"

	"golang.org/x/sync/errgroup"

	"github.com/tokenguard/tokenguard/domain"
)

// ConnectionLister lists the stored connections.
type ConnectionLister interface {
	// Each calls fn with every stored token, a page at a time.
	Each(ctx context.Context, fn func(domain.Token) error) error
}

// APICaller makes one call to the external API on behalf of a connection.
type APICaller interface {
	Call(ctx context.Context, connection, path string) error
}

// CallResult is the outcome of one connection's call.
type CallResult struct {
	Connection string
	Err        error
}

// CallAllResult is the outcome of one CallAll round.
type CallAllResult struct {
	Calls   []CallResult // one per active connection, in name order
	Skipped []string     // connections that need re-authorisation
}

// CallAllUseCase calls an API path once for every active connection.
type CallAllUseCase struct {
	conns       ConnectionLister
	api         APICaller
	path        string
	concurrency int
}

// NewCallAllUseCase calls path with at most concurrency (at least 1) calls at a time.
func NewCallAllUseCase(conns ConnectionLister, api APICaller, path string, concurrency int) *CallAllUseCase {
	return &CallAllUseCase{conns: conns, api: api, path: path, concurrency: max(concurrency, 1)}
}

// CallAll makes one call per active connection. A failed call is reported in the result; the
// error is for failing to list the connections.
func (u *CallAllUseCase) CallAll(ctx context.Context) (CallAllResult, error) {
	var res CallAllResult
	err := u.conns.Each(ctx, func(t domain.Token) error {
		if t.Status == domain.StatusActive {
			res.Calls = append(res.Calls, CallResult{Connection: t.Connection})
		} else {
			res.Skipped = append(res.Skipped, t.Connection)
		}
		return nil
	})
	if err != nil {
		return CallAllResult{}, fmt.Errorf("list connections: %w", err)
	}
	var g errgroup.Group
	g.SetLimit(u.concurrency)
	for i := range res.Calls {
		g.Go(func() error {
			res.Calls[i].Err = u.api.Call(ctx, res.Calls[i].Connection, u.path)
			return nil
		})
	}
	_ = g.Wait() // each call's error is in its result
	return res, nil
}
