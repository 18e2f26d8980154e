package tokenguard_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokenguard/tokenguard"
)

// An application on pgx, without GORM: tokenguard runs on its pgxpool.Pool
// (no second pool) and Run listens with the pool's configuration.
func ExampleOpenPool() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL()) // the application's own pool
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	db, err := tokenguard.OpenPool(pool)
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
	defer tokens.Close(ctx) // before the pool closes
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	go tokens.Run(runCtx) // listens on a connection made from the pool's configuration
	if err := tokens.WaitReady(ctx); err != nil {
		log.Fatal(err)
	}

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
