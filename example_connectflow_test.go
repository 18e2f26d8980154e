package tokenguard_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/url"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard"
)

// Connecting an account from the application's own pages. AuthCodeURL
// starts the flow; the flow stays server-side in the user's session. The
// callback's Complete keeps the grant pending and gives a one-time result
// code; Redeem stores it, once the application has checked that the
// browser which came back is the user who started. A result nobody
// redeems is revoked at the provider after ResultLifetime
// (SweepConnectResults).
func ExampleTokens_AuthCodeURL() {
	ctx := context.Background()
	db, err := gorm.Open(postgres.Open(databaseURL()), &gorm.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := tokenguard.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	tokens, err := tokenguard.New(db, oauthConfig()) // with Endpoint.AuthURL, RedirectURL, Scopes
	if err != nil {
		log.Fatal(err)
	}
	defer tokens.Close(ctx)

	// GET /connect (the signed-in user asked for it): remember the flow in
	// the user's session, send the browser to the provider.
	authURL, flow, err := tokens.AuthCodeURL(ctx, tokenguard.ConnectFlow{Connection: "acme"})
	if err != nil {
		log.Fatal(err)
	}

	// The provider sends the browser back to RedirectURL with a code.
	callback := consent(authURL)

	// GET /oauth/callback: the flow from the user's session, the query.
	result, err := tokens.Complete(ctx, flow, callback)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("stored before Redeem:", connected(ctx, tokens, "acme"))

	// The same user's session holds the result: store the grant.
	c, err := tokens.Redeem(ctx, result.Code)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("connected:", c.Connection, c.Scopes)
	_, err = tokens.Redeem(ctx, result.Code)
	fmt.Println("again:", err)
	// Output:
	// stored before Redeem: false
	// connected: acme [api]
	// again: redeem: connect result unknown, expired or already redeemed
}

// consent is the person at the provider: the sandbox approves at once and
// redirects to the redirect URL, whose query it returns.
func consent(authURL string) url.Values {
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Get(authURL)
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	loc, err := url.Parse(resp.Header.Get("Location"))
	if err != nil {
		log.Fatal(err)
	}
	return loc.Query()
}

func connected(ctx context.Context, tokens *tokenguard.Tokens, name string) bool {
	conns, _, err := tokens.Connections(ctx, "", 10)
	if err != nil {
		log.Fatal(err)
	}
	for _, c := range conns {
		if c.Name == name {
			return true
		}
	}
	return false
}
