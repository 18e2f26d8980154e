package tokenguard_test

import (
	"context"
	"fmt"
	"log"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard"
)

// An application that already has its *gorm.DB and its client
// registration: migrate, build the token layer once per process, run its
// listener, and call the API through Client, which refreshes under the
// connection's lock when the token is due and recovers a 401 caused by
// another process's refresh.
func Example() {
	ctx := context.Background()
	db, err := gorm.Open(postgres.Open(databaseURL()), &gorm.Config{}) // the application's own pool
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
	runCtx, stopRun := context.WithCancel(ctx)
	go tokens.Run(runCtx) // the cache, kept right across processes
	defer stopRun()
	defer tokens.Close(ctx) // on shutdown, before the pool closes: waits for refreshes in flight

	// Store a connection's first grant (from the authorization-code flow).
	if err := tokens.Import(ctx, "acme", firstGrant()); err != nil {
		log.Fatal(err)
	}
	resp, err := tokens.Client(ctx, "acme").Get(apiURL() + "/resource")
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	fmt.Println(resp.Status)
	// Output: 200 OK
}
