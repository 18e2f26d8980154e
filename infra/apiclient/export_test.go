package apiclient

import (
	"context"
	"net/http"
)

// TokenClients is Clients on Tokens, for tests that hold a use case rather than a *tokenguard.Tokens.
func TokenClients(t Tokens) Clients { return tokenClients{t} }

type tokenClients struct{ t Tokens }

func (c tokenClients) Client(ctx context.Context, connection string) *http.Client {
	return NewHTTPClient(ctx, c.t, connection)
}
