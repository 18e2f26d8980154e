// Command worker consumes the events the server queues and, for each, calls
// the external API with the connection's token.
package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/tokenguard/tokenguard/di"
)

func main() {
	os.Exit(di.Run("worker", os.Environ(), os.Stderr, func(ctx context.Context, cfg di.AppConfig, log *slog.Logger) error {
		w, cleanup, err := di.NewWorker(ctx, cfg, log)
		if err != nil {
			return err
		}
		defer cleanup()
		return w.Run(ctx)
	}))
}
