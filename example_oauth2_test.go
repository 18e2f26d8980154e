package tokenguard_test

import (
	"context"
	"fmt"
	"log"

	"golang.org/x/oauth2"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard"
)

// Code that takes an oauth2.TokenSource. oauth2.NewClient caches the token
// until the Expiry tokenguard reports (the provider's expiry minus the
// skew, before any process refreshes it), but it cannot recover a 401; use
// Client where you can.
func ExampleTokens_TokenSource() {
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
	if err := tokens.Import(ctx, "acme", firstGrant()); err != nil {
		log.Fatal(err)
	}

	client := oauth2.NewClient(ctx, tokens.TokenSource(ctx, "acme"))
	resp, err := client.Get(apiURL() + "/resource")
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	fmt.Println(resp.Status)
	// Output: 200 OK
}
