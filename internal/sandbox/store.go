package sandbox

import (
	"context"
	"crypto/subtle"
	"errors"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/ory/fosite"
	"github.com/ory/fosite/storage"
)

// store wraps fosite's MemoryStore to (1) remember which refresh-token
// signatures were rotated away, so reuse is detected from our own record and
// not from fosite's error text, (2) remember every grant (request ID) for
// RevokeAll, (3) close a data race in MemoryStore and (4) support the "*"
// redirect URI.
//
// The race: MemoryStore.RevokeRefreshToken writes the RefreshTokens map while
// holding only refreshTokenRequestIDsMutex, whereas GetRefreshTokenSession and
// DeleteRefreshTokenSession hold only refreshTokensMutex. mu orders all
// refresh-token map access. It is held for microseconds and is not the
// rotation lock: code exchanges take it briefly too.
type store struct {
	*storage.MemoryStore
	anyRedirect bool
	secrets     atomic.Pointer[clientSecrets] // nil: the secret the client was registered with

	mu      sync.RWMutex
	rotated map[string]struct{} // refresh-token signatures rotated away
	grants  map[string]struct{} // request IDs that were issued tokens
}

func newStore(ms *storage.MemoryStore, anyRedirect bool) *store {
	return &store{
		MemoryStore: ms,
		anyRedirect: anyRedirect,
		rotated:     make(map[string]struct{}),
		grants:      make(map[string]struct{}),
	}
}

// redirectKey carries the requested redirect_uri from the authorization
// endpoint to GetClient when the client accepts any redirect URI.
type redirectKey struct{}

// GetClient returns the registered client. When "*" is configured and the
// authorization endpoint put the requested redirect URI into ctx, it returns
// a copy of the client that has that URI registered, so fosite's exact
// redirect URI matching accepts it.
func (s *store) GetClient(ctx context.Context, id string) (fosite.Client, error) {
	c, err := s.MemoryStore.GetClient(ctx, id)
	if err == nil {
		c = s.withSecrets(c)
	}
	if err != nil || !s.anyRedirect {
		return c, err
	}
	uri, _ := ctx.Value(redirectKey{}).(string)
	if uri == "" {
		return c, nil
	}
	switch dc := c.(type) {
	case *fosite.DefaultClient:
		cp := *dc
		cp.RedirectURIs = append(slices.Clone(dc.RedirectURIs), uri)
		return &cp, nil
	case *fosite.DefaultOpenIDConnectClient:
		cp, inner := *dc, *dc.DefaultClient
		inner.RedirectURIs = append(slices.Clone(inner.RedirectURIs), uri)
		cp.DefaultClient = &inner
		return &cp, nil
	}
	return c, nil
}

func (s *store) CreateAccessTokenSession(ctx context.Context, signature string, req fosite.Requester) error {
	s.mu.Lock()
	s.grants[req.GetID()] = struct{}{}
	s.mu.Unlock()
	return s.MemoryStore.CreateAccessTokenSession(ctx, signature, req)
}

func (s *store) CreateRefreshTokenSession(ctx context.Context, signature, accessSignature string, req fosite.Requester) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.grants[req.GetID()] = struct{}{}
	return s.MemoryStore.CreateRefreshTokenSession(ctx, signature, accessSignature, req)
}

func (s *store) GetRefreshTokenSession(ctx context.Context, signature string, session fosite.Session) (fosite.Requester, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.MemoryStore.GetRefreshTokenSession(ctx, signature, session)
}

func (s *store) DeleteRefreshTokenSession(ctx context.Context, signature string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.MemoryStore.DeleteRefreshTokenSession(ctx, signature)
}

func (s *store) RevokeRefreshToken(ctx context.Context, requestID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.MemoryStore.RevokeRefreshToken(ctx, requestID)
}

// RotateRefreshToken is called by fosite's refresh handler with the signature
// of the presented refresh token, right before it issues the new pair.
// MemoryStore marks the grant's refresh token inactive and deletes its access
// token; we additionally record the signature as rotated away.
func (s *store) RotateRefreshToken(ctx context.Context, requestID, signature string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rotated[signature] = struct{}{}
	return s.MemoryStore.RotateRefreshToken(ctx, requestID, signature)
}

// wasRotated reports whether the refresh token with this signature was
// already consumed by a successful refresh.
func (s *store) wasRotated(signature string) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	_, ok := s.rotated[signature]
	return ok
}

func (s *store) revokeAll() {
	ctx := context.Background()
	s.mu.Lock()
	defer s.mu.Unlock()
	for id := range s.grants {
		// ErrNotFound: the grant's refresh token was already deleted by
		// fosite's reuse handling. Nothing else can fail in MemoryStore.
		_ = s.MemoryStore.RevokeRefreshToken(ctx, id)
		_ = s.MemoryStore.RevokeAccessToken(ctx, id)
	}
}

// plainSecret compares client secrets in constant time without hashing.
// fosite's default bcrypt (cost 12) would add ~250ms to every token request,
// and refresh grants run one at a time here; the sandbox's secret is no
// secret anyway.
type plainSecret struct{}

var errSecretMismatch = errors.New("client secret does not match")

func (plainSecret) Compare(_ context.Context, hash, data []byte) error {
	if subtle.ConstantTimeCompare(hash, data) != 1 {
		return errSecretMismatch
	}
	return nil
}

func (plainSecret) Hash(_ context.Context, data []byte) ([]byte, error) {
	return slices.Clone(data), nil
}
