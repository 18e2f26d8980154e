package tokenguard

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/usecase"
)

// Connection is a connection as Connections lists it: its state and the
// application's metadata, never a token.
type Connection struct {
	Name     string
	Provider string // "" for the one of New's oauth2.Config
	// Status is "active", "failing" (unclassifiable answers) or "needs_reauth"; Reason says why.
	Status, Reason string
	Expiry         time.Time       // of the access token; zero: the provider gave none
	RefreshExpiry  time.Time       // of the refresh token; zero: unknown
	LastRefresh    time.Time       // the last refresh or grant
	Version        int64           // bumped by every write
	Account        string          // the provider account that granted it, if known
	Metadata       json.RawMessage // a JSON object, {} when none: see WithMetadata
	Tags           []string
}

// Connections pages through the connections in name order: up to limit
// (1 to 1000; 0 means 100) whose names sort after after ("" for the first
// page), and next, the after of the following page ("" after the last).
func (t *Tokens) Connections(ctx context.Context, after string, limit int) (conns []Connection, next string, err error) {
	if t.closed.Load() {
		return nil, "", ErrClosed
	}
	if limit = cmp.Or(limit, 100); limit < 1 || limit > 1000 {
		return nil, "", fmt.Errorf("tokenguard: Connections: limit %d, want 1 to 1000", limit)
	}
	page, err := t.repo.ConnectionsPage(ctx, after, limit+1) // one more says whether a next page exists
	if err != nil {
		return nil, "", err
	}
	if len(page) > limit {
		page = page[:limit]
		next = page[limit-1].Name
	}
	conns = make([]Connection, len(page))
	for i, c := range page {
		conns[i] = Connection{Name: c.Name, Provider: c.Provider, Status: string(c.Status), Reason: c.StatusReason,
			Expiry: c.Expiry, RefreshExpiry: c.RefreshExpiry, LastRefresh: c.ObtainedAt, Version: c.Version,
			Account: c.Binding.Account, Metadata: c.Metadata.Object, Tags: c.Metadata.Tags}
	}
	return conns, next, nil
}

// Disconnect deletes connection after any refresh in progress. With revoke,
// it first revokes the refresh token at the provider under the connection's
// lock, and deletes nothing if that fails: deleting the only handle on a live
// grant would leave it live for good (call it without revoke to delete anyway).
func (t *Tokens) Disconnect(ctx context.Context, connection string, revoke bool) error {
	if t.closed.Load() {
		return ErrClosed
	}
	_, err := t.disconnect.Disconnect(ctx, connection, revoke)
	return err
}

// Reactivate sets a needs_reauth connection active again, tokens untouched
// (the next refresh tells whether the grant is alive). It returns the version
// written, 0 when it left the connection alone, or ErrNotFound.
func (t *Tokens) Reactivate(ctx context.Context, connection string) (version int64, err error) {
	if t.closed.Load() {
		return 0, ErrClosed
	}
	if err := domain.ValidateName(connection); err != nil {
		return 0, err
	}
	_, version, err = t.repo.Reactivate(ctx, connection, "", t.o.LockWait)
	if err != nil {
		return 0, fmt.Errorf("reactivate %s: %w", connection, err)
	}
	return version, nil
}

// ImportOption configures Import.
type ImportOption func(*usecase.ConnectRequest) error

// WithMetadata replaces the connection's own bookkeeping with object, a JSON
// object of at most 16 KiB (nil means {}), and up to 32 tags (else ErrInvalidMetadata).
func WithMetadata(object json.RawMessage, tags ...string) ImportOption {
	return func(r *usecase.ConnectRequest) error {
		m, err := domain.NewMetadata(object, tags)
		if err != nil {
			return err
		}
		r.Metadata = &m
		return nil
	}
}

// WithProvider names the stored provider that issued the grant (default:
// New's oauth2.Config); one not stored is ErrUnknownProvider.
func WithProvider(name string) ImportOption {
	return func(r *usecase.ConnectRequest) error {
		r.Provider = name
		return nil
	}
}
