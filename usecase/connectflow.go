package usecase

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// PendingStore keeps the grants of connect flows until redeemed (repository.ConnectResults).
type PendingStore interface {
	Keep(ctx context.Context, p domain.PendingGrant) (domain.Secret, time.Time, error)
	// Pending reads an unexpired result and its row id; domain.ErrResultInvalid otherwise.
	Pending(ctx context.Context, code domain.Secret) (int64, domain.PendingGrant, error)
	// Refuse makes the result id expired at once.
	Refuse(ctx context.Context, id int64) error
	// Expired leases up to limit expired results, committed: nothing stays held.
	Expired(ctx context.Context, limit int, lease time.Duration) ([]domain.ExpiredGrant, error)
	Delete(ctx context.Context, id int64) error
}

// ConnectFlowUseCase holds a consent's grant until the app's backend redeems it; revokes those never redeemed.
type ConnectFlowUseCase struct {
	results PendingStore
	connect *ConnectUseCase
	revoker Revoker // nil: no revocation endpoint anywhere
	timeout time.Duration
	log     *slog.Logger
}

// NewConnectFlowUseCase builds the use case; revoker may be nil, revokeTimeout <= 0 is DefaultRevokeTimeout.
func NewConnectFlowUseCase(results PendingStore, connect *ConnectUseCase, revoker Revoker, revokeTimeout time.Duration, log *slog.Logger) *ConnectFlowUseCase {
	return &ConnectFlowUseCase{results: results, connect: connect, revoker: revoker,
		timeout: cmp.Or(max(revokeTimeout, 0), DefaultRevokeTimeout), log: cmp.Or(log, slog.Default())}
}

// Keep stores p pending and returns its one-time result code.
func (u *ConnectFlowUseCase) Keep(ctx context.Context, p domain.PendingGrant) (domain.Secret, time.Time, error) {
	return u.results.Keep(ctx, p)
}

// Redeem stores the grant of the result code, bound to the account that granted it
// (domain.ErrAccountMismatch unless the session allowed the change), in one transaction with the
// result's deletion. An unknown, expired or redeemed code is domain.ErrResultInvalid and stores
// nothing, as does allow's refusal of the connection (nil allow: any). A grant refused for good is
// expired at once, so the sweep revokes it.
func (u *ConnectFlowUseCase) Redeem(ctx context.Context, code domain.Secret, allow func(connection string) error) (domain.Token, domain.PendingGrant, error) {
	id, p, err := u.results.Pending(ctx, code)
	if err != nil {
		return domain.Token{}, domain.PendingGrant{}, err
	}
	if allow != nil {
		// Before anything is spent: the result is left to a caller that may.
		if err := allow(p.Connection); err != nil {
			return domain.Token{}, domain.PendingGrant{Connection: p.Connection}, err
		}
	}
	t, err := u.connect.ConnectGrant(ctx, p.Connection, p.Grant, ConnectRequest{
		Binding: p.Binding, AllowAccountChange: p.AllowAccountChange, Metadata: p.Metadata, Provider: p.Provider,
		ProviderFields: p.ProviderFields, Result: id, DPoPKey: p.DPoPKey, DPoPJKT: p.DPoPJKT})
	if errors.Is(err, domain.ErrAccountMismatch) || errors.Is(err, domain.ErrInvalidToken) || errors.Is(err, domain.ErrUnknownProvider) ||
		errors.Is(err, domain.ErrInvalidMetadata) {
		if rerr := u.results.Refuse(context.WithoutCancel(ctx), id); rerr != nil {
			u.log.Error("a refused connect result could not be expired; it expires by itself", "connection", p.Connection, "err", rerr)
		}
	}
	return t, p, err
}

// sweepBatch bounds the results one sweep revokes.
const sweepBatch = 20

// Sweep revokes at their provider the grants of expired results and deletes them, returning how
// many. Each is leased first, so two sweeping processes revoke it once; a failed revocation keeps
// the result for the next sweep.
func (u *ConnectFlowUseCase) Sweep(ctx context.Context) (int, error) {
	expired, err := u.results.Expired(ctx, sweepBatch, u.timeout+5*time.Second) // the lease outlasts a revocation
	if err != nil {
		return 0, fmt.Errorf("sweep connect results: %w", err)
	}
	deleted := 0
	for _, e := range expired {
		err := fmt.Errorf("no revoker: %w", domain.ErrNoRevocationEndpoint)
		if u.revoker != nil {
			rctx, cancel := context.WithTimeout(ctx, u.timeout)
			err = revokeWith(rctx, u.revoker, e.Provider, e.RefreshToken, e.DPoPKey)
			cancel()
		}
		switch {
		case err == nil:
			u.log.Info("the grant of an expired connect result was revoked at the provider", "connection", e.Connection, "provider", e.Provider)
		case errors.Is(err, domain.ErrNoRevocationEndpoint), errors.Is(err, domain.ErrUnknownProvider):
			u.log.Warn("an expired connect result was deleted without revoking its grant", "connection", e.Connection, "provider", e.Provider, "err", err)
		default:
			u.log.Warn("the grant of an expired connect result could not be revoked; trying again later",
				"connection", e.Connection, "provider", e.Provider, "err", err)
			continue
		}
		if err := u.results.Delete(ctx, e.ID); err != nil {
			return deleted, fmt.Errorf("sweep connect results: %w", err)
		}
		deleted++
	}
	return deleted, nil
}
