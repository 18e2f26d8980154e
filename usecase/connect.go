package usecase

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// ConnectUseCase stores a connection's first grant, or a new one after the old was revoked
// (tokenctl import, the OAuth callback).
type ConnectUseCase struct {
	store    ConnectionStore
	clock    Clock
	lockWait time.Duration
}

// NewConnectUseCase builds the use case; a nil clock is the system clock, lockWait <= 0 DefaultLockWait.
func NewConnectUseCase(store ConnectionStore, clock Clock, lockWait time.Duration) *ConnectUseCase {
	return &ConnectUseCase{store: store, clock: cmp.Or[Clock](clock, systemClock{}),
		lockWait: cmp.Or(max(lockWait, 0), DefaultLockWait)}
}

// Connect stores g as connection's token and makes it active, under the connection's lock, so it
// never interleaves with a refresh.
func (u *ConnectUseCase) Connect(ctx context.Context, connection string, g domain.Grant) (domain.Token, error) {
	return u.ConnectGrant(ctx, connection, g, ConnectRequest{AllowAccountChange: true})
}

// ConnectRequest is what comes with a new grant besides its tokens.
type ConnectRequest struct {
	Binding            domain.Binding // who granted it; zero when unknown
	AllowAccountChange bool           // a grant from another account may replace the connection's
	// Metadata replaces the connection's metadata and tags in the grant's transaction; nil keeps them.
	Metadata *domain.Metadata
	Provider string // the stored provider that issued the grant; "" the process's configured one
	// ProviderFields are what the provider's profile keeps from the grant (Salesforce instance_url):
	// merged into the connection's metadata under "provider_fields", after Metadata.
	ProviderFields map[string]string
	Result         int64 // the pending connect result of the grant (0: none), spent in its transaction
	// DPoPKey (PEM) and DPoPJKT (its RFC 7638 thumbprint): the DPoP key the grant is bound to,
	// stored sealed; zero for a bearer grant.
	DPoPKey domain.Secret
	DPoPJKT string
}

// ConnectGrant stores g with what r carries, in one transaction under the connection's lock: a
// refused grant changes nothing. Another account's grant is domain.ErrAccountMismatch unless allowed.
func (u *ConnectUseCase) ConnectGrant(ctx context.Context, connection string, g domain.Grant, r ConnectRequest) (domain.Token, error) {
	b := r.Binding
	tok, err := domain.NewToken(connection, g, u.clock.Now())
	if err != nil {
		return domain.Token{}, err
	}
	if err := domain.ValidateAccount(b.Account); err != nil {
		return domain.Token{}, fmt.Errorf("connect %s: %w", connection, err)
	}
	if b.Scopes == "" && g.ScopeNamed {
		// An import knows the scopes only from the token answer.
		b.Scopes = strings.Join(domain.ScopeFields(g.Scope), " ")
	}
	b.Answered, b.ScopesReduced = "", "" // a new grant: nothing reduced
	tok.Binding, tok.Provider, tok.DPoPKey, tok.DPoPJKT = b, r.Provider, r.DPoPKey, r.DPoPJKT
	if err := u.store.Register(ctx, connection); err != nil {
		return domain.Token{}, fmt.Errorf("connect %s: %w", connection, err)
	}
	var out domain.Token
	err = u.store.InLock(ctx, connection, u.lockWait, DefaultWriteTimeout, func(txCtx context.Context, s LockedStore) error {
		if r.Result != 0 {
			if err := s.SpendResult(txCtx, r.Result); err != nil {
				return err
			}
		}
		if !r.AllowAccountChange {
			cur, err := s.Get(txCtx, connection)
			switch {
			case errors.Is(err, domain.ErrNotFound):
			case err != nil:
				return err
			// The same account id at another provider is another account.
			case cur.Binding.Account != "" && (cur.Binding.Account != b.Account || cur.Provider != r.Provider):
				return domain.ErrAccountMismatch
			}
		}
		if r.Metadata != nil {
			if err := s.SetMetadata(txCtx, connection, *r.Metadata); err != nil {
				return err
			}
		}
		if len(r.ProviderFields) > 0 {
			if err := s.SetProviderFields(txCtx, connection, r.ProviderFields); err != nil {
				return err
			}
		}
		out, err = s.Put(txCtx, tok)
		return err
	})
	if err != nil {
		return domain.Token{}, fmt.Errorf("connect %s: %w", connection, err)
	}
	return out, nil
}
