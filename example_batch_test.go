package tokenguard_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard"
)

// The main of a batch job: one call per connection, then exit. A process
// this short needs no Run (every call reads the database, which is what
// it would do anyway); Close, deferred before the pool's Close, lets a
// refresh that SIGTERM interrupted store its rotated token.
func Example_batch() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	db, err := gorm.Open(postgres.Open(databaseURL()), &gorm.Config{})
	if err != nil {
		log.Fatal(err)
	}
	sqlDB, _ := db.DB()
	defer sqlDB.Close()
	if err := tokenguard.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	tokens, err := tokenguard.New(db, oauthConfig())
	if err != nil {
		log.Fatal(err)
	}
	defer tokens.Close(context.Background()) // runs before sqlDB.Close
	for _, name := range []string{"acme", "globex"} {
		if err := tokens.Import(ctx, name, firstGrant()); err != nil {
			log.Fatal(err)
		}
	}

	failed := 0
	for _, name := range []string{"acme", "globex"} {
		resp, err := tokens.Client(ctx, name).Get(apiURL() + "/resource")
		if err != nil {
			log.Printf("%s: %v", name, err)
			failed++
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			failed++
		}
	}
	fmt.Println("failed:", failed)
	// Output: failed: 0
}
