// Command server is the HTTP app: see infra/httpapi for its endpoints and
// docs/configuration.md for its configuration.
package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/tokenguard/tokenguard/di"
)

func main() {
	os.Exit(di.Run("server", os.Environ(), os.Stderr, func(ctx context.Context, cfg di.AppConfig, log *slog.Logger) error {
		srv, cleanup, err := di.NewServer(ctx, cfg, log)
		if err != nil {
			return err
		}
		defer cleanup()
		return srv.Run(ctx)
	}))
}
