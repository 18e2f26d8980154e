package tokenguard

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/clientkey"
	"github.com/tokenguard/tokenguard/infra/provider"
	"github.com/tokenguard/tokenguard/usecase"
)

// Connection is a connection as Connections lists it: its state and the
// application's metadata, never a token.
type Connection struct {
	Name     string
	Provider string // "" for the one of New's oauth2.Config
	// Status is "active", "failing" (active, but its refreshes keep
	// getting answers tokenguard cannot classify: Reason gives the last
	// one's HTTP status and code) or "needs_reauth" (Reason says why).
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
// Each page is one indexed query; no token is read.
func (t *Tokens) Connections(ctx context.Context, after string, limit int) (conns []Connection, next string, err error) {
	if t.closed.Load() {
		return nil, "", ErrClosed
	}
	if limit == 0 {
		limit = 100
	}
	if limit < 1 || limit > 1000 {
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

// Disconnect deletes connection: every process running Run drops its
// cached copy when the deletion commits (Token answers ErrNotFound). It
// waits for a refresh of the connection in progress.
//
// With revoke, it first revokes the refresh token at the provider, holding
// the connection's lock so that the token revoked is the current one. If
// the revocation fails nothing is deleted and the error says why: deleting
// the only handle on a grant still live would leave it live for good;
// call it again, or without revoke to delete it anyway.
func (t *Tokens) Disconnect(ctx context.Context, connection string, revoke bool) error {
	if t.closed.Load() {
		return ErrClosed
	}
	_, err := t.disconnect.Disconnect(ctx, connection, revoke)
	return err
}

// Reactivate sets a needs_reauth connection active again, tokens
// untouched: the next refresh tells whether the grant is alive. It is the
// way back for a grant marked dead through no fault of its own (a client
// secret rotated too early, say). It takes the connection's lock, and
// returns the version written, or 0 when it left the connection alone;
// ErrNotFound for a connection that has no token.
func (t *Tokens) Reactivate(ctx context.Context, connection string) (version int64, err error) {
	if t.closed.Load() {
		return 0, ErrClosed
	}
	if err := domain.ValidateName(connection); err != nil {
		return 0, err
	}
	_, version, err = t.repo.Reactivate(ctx, connection, "", t.lockWait)
	if err != nil {
		return 0, fmt.Errorf("reactivate %s: %w", connection, err)
	}
	return version, nil
}

// ImportOption configures Import.
type ImportOption func(*usecase.ConnectRequest) error

// WithMetadata gives the connection the application's own bookkeeping (a
// tenant id, say): object, a JSON object of at most 16 KiB (nil means {}),
// and up to 32 tags, replacing the connection's in the transaction that
// stores the grant. Bad metadata is ErrInvalidMetadata.
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

// WithProvider names the stored provider that issued the grant; without
// it the grant is New's oauth2.Config's. A provider not stored is
// ErrUnknownProvider.
func WithProvider(name string) ImportOption {
	return func(r *usecase.ConnectRequest) error {
		r.Provider = name
		return nil
	}
}

// newRevoker revokes refresh tokens at url ("" for none) for cfg's
// provider, at a stored provider's own endpoint for the others.
func newRevoker(cfg *oauth2.Config, url string, o options, styles provider.AuthStyleStore, providers provider.ProviderLookup,
	key *clientkey.Key, issuerAud bool, d *provider.Discovery) *provider.Revocations {
	env := provider.RevocationEndpoint{URL: url, ClientID: cfg.ClientID, ClientSecret: domain.NewSecret(cfg.ClientSecret),
		AuthStyle: cfg.Endpoint.AuthStyle, TokenURL: cfg.Endpoint.TokenURL, ClientKey: key}
	if key != nil && issuerAud {
		env.IssuerAud = d
	}
	return provider.NewRevocations(provider.StoredRevocationEndpoints{Env: env, Providers: providers, Discovery: d},
		provider.NewHTTPClient(o.refreshTimeout), styles)
}
