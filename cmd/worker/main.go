// Command worker consumes the events the server queues and, for each, calls
// the external API with the connection's token.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/tokenguard/tokenguard/di"
)

func main() {
	if di.HelpAsked(os.Args[1:]) {
		fmt.Print("usage: worker\n\nConsumes the events the server queues and, for each, calls the external API with the\nconnection's token; sends the webhooks. Stops on SIGTERM or SIGINT.\n")
		di.PrintEnv(os.Stdout, di.AppConfig{}, true)
		return
	}
	os.Exit(di.Run("worker", os.Environ(), os.Stderr, func(ctx context.Context, cfg di.AppConfig, log *slog.Logger) error {
		w, cleanup, err := di.NewWorker(ctx, cfg, log)
		if err != nil {
			return err
		}
		defer cleanup()
		return w.Run(ctx)
	}))
}
