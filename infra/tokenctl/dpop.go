package tokenctl

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/dpop"
)

// BoundConnector stores a grant bound to a DPoP key, the key sealed with
// it (tokenctl import --dpop-key-file).
type BoundConnector interface {
	ConnectBound(ctx context.Context, connection, provider string, g domain.Grant, metadata *domain.Metadata, key domain.Secret, jkt string) (domain.Token, error)
}

// boundKey is an imported grant's DPoP key; zero for a bearer grant.
type boundKey struct {
	pem domain.Secret
	jkt string
}

// readDPoPKey reads the PEM private key at path ("" for none); errors never quote the file.
func readDPoPKey(path string) (boundKey, error) {
	if path == "" {
		return boundKey{}, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return boundKey{}, fmt.Errorf("--dpop-key-file: %w", errors.Unwrap(err))
	}
	k, err := dpop.ParsePEM(data)
	if err != nil {
		return boundKey{}, fmt.Errorf("--dpop-key-file: %w", err)
	}
	return boundKey{pem: domain.NewSecret(string(k.MarshalPEM())), jkt: k.Thumbprint()}, nil
}

func (k boundKey) connect(ctx context.Context, store Store, connection, provider string, g domain.Grant, metadata *domain.Metadata) (domain.Token, error) {
	if k.pem.IsZero() {
		return store.Connect(ctx, connection, provider, g, metadata)
	}
	b, ok := store.(BoundConnector)
	if !ok {
		return domain.Token{}, errors.New("this store cannot keep DPoP keys")
	}
	return b.ConnectBound(ctx, connection, provider, g, metadata, k.pem, k.jkt)
}
