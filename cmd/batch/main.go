// Command batch calls the external API once for every active connection and exits 0 if every call succeeded,
// 1 otherwise. With --every it repeats until SIGTERM. Each round prints one JSON line on stdout.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/tokenguard/tokenguard/di"
	"github.com/tokenguard/tokenguard/infra/batch"
)

func main() {
	fs := flag.NewFlagSet("batch", flag.ContinueOnError)
	every := fs.Duration("every", 0, "repeat every `DURATION` until SIGTERM (default: one round)")
	ahead := fs.Duration("refresh-ahead", 0, "first refresh every connection expiring within `DURATION` (0: off)")
	keepAlive := fs.Duration("keep-alive", 0, "first refresh every connection not refreshed for `DURATION`, for providers whose refresh tokens die unused (0: off)")
	concurrency := fs.Int("refresh-concurrency", 8, "refresh requests at the provider at once for --refresh-ahead and --keep-alive")
	if di.HelpAsked(os.Args[1:]) {
		fmt.Print("usage: batch [flags]\n\nCalls the external API once for every active connection; exits 0 if every call succeeded,\n1 otherwise. Each round prints one JSON line on stdout.\n\nFlags:\n")
		fs.SetOutput(os.Stdout)
		fs.PrintDefaults()
		di.PrintEnv(os.Stdout, di.AppConfig{}, true)
		return
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if *every < 0 || *ahead < 0 || *keepAlive < 0 || *concurrency < 1 || fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "batch: usage: batch [--every DURATION] [--refresh-ahead DURATION] [--keep-alive DURATION] [--refresh-concurrency N]")
		os.Exit(2)
	}
	os.Exit(di.Run("batch", os.Environ(), os.Stderr, func(ctx context.Context, cfg di.AppConfig, log *slog.Logger) error {
		runner, cleanup, err := di.NewBatch(ctx, cfg, os.Stdout, log, di.RefreshAhead{Window: *ahead, KeepAlive: *keepAlive, Concurrency: *concurrency})
		if err != nil {
			return err
		}
		defer cleanup()
		err = runner.Run(ctx, *every)
		if errors.Is(err, batch.ErrFailed) {
			return di.ExitCode(1)
		}
		return err
	}))
}
