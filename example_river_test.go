package tokenguard_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard"
)

// CallAPIArgs is a job: call the provider's API for a connection.
type CallAPIArgs struct {
	Connection string `json:"connection"`
}

func (CallAPIArgs) Kind() string { return "call_api" }

// CallAPIWorker calls the API with the connection's token. River retries a
// failed job with backoff; a connection that must be connected again is
// not retried.
type CallAPIWorker struct {
	river.WorkerDefaults[CallAPIArgs]
	Tokens *tokenguard.Tokens
}

func (w *CallAPIWorker) Work(ctx context.Context, job *river.Job[CallAPIArgs]) error {
	resp, err := w.Tokens.Client(ctx, job.Args.Connection).Get(apiURL() + "/resource")
	if errors.Is(err, tokenguard.ErrNeedsReauth) || errors.Is(err, tokenguard.ErrNotFound) {
		return river.JobCancel(err)
	}
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("API answered %s", resp.Status)
	}
	return nil
}

// A job consumer (River here; any runner works the same way): each job
// calls the API through Client. River runs on a pgx pool of its own; the
// tokens live on the application's *gorm.DB, in the same database.
func ExampleTokens_Client_river() {
	ctx := context.Background()
	url := databaseURL()
	db, err := gorm.Open(postgres.Open(url), &gorm.Config{})
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
	defer tokens.Close(ctx) // after the client stopped (defers run last first)
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	go tokens.Run(runCtx)
	if err := tokens.Import(ctx, "acme", firstGrant()); err != nil {
		log.Fatal(err)
	}

	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		log.Fatal(err)
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, &CallAPIWorker{Tokens: tokens})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}},
		Workers: workers,
	})
	if err != nil {
		log.Fatal(err)
	}
	completed, unsubscribe := client.Subscribe(river.EventKindJobCompleted)
	defer unsubscribe()
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer client.Stop(ctx)

	if _, err := client.Insert(ctx, CallAPIArgs{Connection: "acme"}, nil); err != nil {
		log.Fatal(err)
	}
	ev := <-completed
	fmt.Println(ev.Job.Kind, ev.Job.State)
	// Output: call_api completed
}
