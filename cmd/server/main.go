// Command server is the HTTP app: see infra/httpapi for its endpoints and
// docs/configuration.md for its configuration.
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
		fmt.Print("usage: server\n\nThe token API, the proxy, the connect flow and the operator console on HTTP_ADDR.\nMigrates first unless MIGRATE_ON_START=false. Stops on SIGTERM or SIGINT.\n")
		di.PrintEnv(os.Stdout, di.AppConfig{}, true)
		return
	}
	os.Exit(di.Run("server", os.Environ(), os.Stderr, func(ctx context.Context, cfg di.AppConfig, log *slog.Logger) error {
		srv, cleanup, err := di.NewServer(ctx, cfg, log)
		if err != nil {
			return err
		}
		defer cleanup()
		return srv.Run(ctx)
	}))
}
