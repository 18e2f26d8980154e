package tokenguard_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard"
	"github.com/tokenguard/tokenguard/internal/sandbox"
)

// Each connection can carry the application's own bookkeeping (here the
// tenant it belongs to), stored with the grant; Connections pages through
// the connections with it, a keyset page at a time, and never returns a
// token.
func ExampleTokens_Connections() {
	ctx := context.Background()
	db, err := gorm.Open(postgres.Open(databaseURL()), &gorm.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := tokenguard.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	tokens, err := tokenguard.New(db, oauthConfig())
	if err != nil {
		log.Fatal(err)
	}
	defer tokens.Close(ctx)
	for _, name := range []string{"acme", "globex", "initech"} {
		meta := tokenguard.WithMetadata(json.RawMessage(`{"tenant":"t-`+name+`"}`), "crm")
		if err := tokens.Import(ctx, name, firstGrant(), meta); err != nil {
			log.Fatal(err)
		}
	}
	for after := ""; ; {
		page, next, err := tokens.Connections(ctx, after, 2)
		if err != nil {
			log.Fatal(err)
		}
		for _, c := range page {
			fmt.Println(c.Name, c.Status, string(c.Metadata), c.Tags)
		}
		if next == "" {
			break
		}
		after = next
	}
	// Output:
	// acme active {"tenant":"t-acme"} [crm]
	// globex active {"tenant":"t-globex"} [crm]
	// initech active {"tenant":"t-initech"} [crm]
}

// Disconnect removes a connection for every process: with revoke, its
// refresh token is revoked at the provider's revocation endpoint first, so
// the grant dies at the provider too.
func ExampleTokens_Disconnect() {
	ctx := context.Background()
	db, err := gorm.Open(postgres.Open(databaseURL()), &gorm.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := tokenguard.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	tokens, err := tokenguard.New(db, oauthConfig(), tokenguard.WithRevocationURL(revocationURL()))
	if err != nil {
		log.Fatal(err)
	}
	defer tokens.Close(ctx)
	if err := tokens.Import(ctx, "acme", firstGrant()); err != nil {
		log.Fatal(err)
	}
	if err := tokens.Disconnect(ctx, "acme", true); err != nil {
		log.Fatal(err)
	}
	_, err = tokens.Token(ctx, "acme")
	fmt.Println(errors.Is(err, tokenguard.ErrNotFound))
	// Output: true
}

// revocationURL is the provider's revocation endpoint (RFC 7009).
func revocationURL() string {
	startSandbox()
	return sandbox.RevocationURL(sandboxURL)
}
