package usecase

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/tokenguard/tokenguard/domain"
)

// TokenReader reads a connection's token without locking.
type TokenReader interface {
	Get(ctx context.Context, connection string) (domain.Token, error)
}

// EventQueue durably queues an event for the worker.
type EventQueue interface {
	// Enqueue stores the event and returns its id.
	Enqueue(ctx context.Context, connection string, payload json.RawMessage) (int64, error)
}

// EnqueueEventUseCase accepts an event for a connection, to be handled by the worker.
type EnqueueEventUseCase struct {
	tokens TokenReader
	queue  EventQueue
}

// NewEnqueueEventUseCase builds the use case.
func NewEnqueueEventUseCase(tokens TokenReader, queue EventQueue) *EnqueueEventUseCase {
	return &EnqueueEventUseCase{tokens: tokens, queue: queue}
}

// Enqueue queues an event for connection and returns its id, refusing a connection that does not
// exist (domain.ErrNotFound) or needs re-authorisation (domain.ErrNeedsReauth).
func (u *EnqueueEventUseCase) Enqueue(ctx context.Context, connection string, payload json.RawMessage) (int64, error) {
	if err := domain.ValidateName(connection); err != nil {
		return 0, err
	}
	var id int64
	t, err := u.tokens.Get(ctx, connection)
	switch {
	case err != nil:
	case t.Status == domain.StatusNeedsReauth:
		err = needsReauth(t)
	default:
		id, err = u.queue.Enqueue(ctx, connection, payload)
	}
	if err != nil {
		return 0, fmt.Errorf("enqueue event for %s: %w", connection, err)
	}
	return id, nil
}
