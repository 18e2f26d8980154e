package di

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
)

// ExitCode, returned by an app's run function, is its silent exit status.
type ExitCode int

func (c ExitCode) Error() string { return fmt.Sprintf("exit status %d", int(c)) }

// Run is the body of an app's main: it reads the configuration, builds a logger on stderr, sets up tracing,
// runs fn until SIGTERM or SIGINT and returns the exit status: 0, 1 for a failure, 2 for a bad setting.
func Run(app string, environ []string, stderr io.Writer, fn func(ctx context.Context, cfg AppConfig, log *slog.Logger) error) int {
	warnings := envWarnings(environ, true)
	cfg, err := AppConfigFromEnv(environ)
	if err != nil {
		// A misspelt variable is often why a setting is missing.
		for _, w := range warnings {
			fmt.Fprintf(stderr, "%s: warning: %s\n", app, w.Message)
		}
		fmt.Fprintf(stderr, "%s: %v\n", app, err)
		return 2
	}
	// Every line says which process wrote it: "who refreshed" comes first.
	log := NewLogger(stderr, cfg.LogLevel, cfg.LogFormat).With("app", app, "pid", os.Getpid())
	for _, w := range warnings {
		log.Warn(w.Message, "variable", w.Variable)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	stopTracing, err := startTracing(ctx, app, environ, log)
	if err != nil {
		return exitStatus(app, stderr, log, err)
	}
	defer stopTracing() // after fn's cleanup: its last spans are exported
	return exitStatus(app, stderr, log, fn(ctx, cfg, log))
}

// exitStatus maps a run function's error to an exit status, reporting it.
func exitStatus(app string, stderr io.Writer, log *slog.Logger, err error) int {
	if err == nil {
		return 0
	}
	if code, ok := errors.AsType[ExitCode](err); ok {
		return int(code)
	}
	if cfgErr, ok := errors.AsType[*ConfigError](err); ok {
		fmt.Fprintf(stderr, "%s: %v\n", app, cfgErr)
		return 2
	}
	log.Error("stopped", "err", err)
	return 1
}

// NewLogger is the apps' logger on w: JSON lines, or key=value lines with format "text".
func NewLogger(w io.Writer, level, format string) *slog.Logger {
	var l slog.Level
	_ = l.UnmarshalText([]byte(strings.ToUpper(level)))
	opts := &slog.HandlerOptions{Level: l}
	if strings.EqualFold(format, "text") {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// Version is the release, set with -ldflags "-X .../di.Version=v1.2.3".
var Version string

// AppVersion is Version, else the module version, else "dev".
func AppVersion() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// UserAgent is app's User-Agent: tokenguard-<app>/<version>.
func UserAgent(app string) string { return "tokenguard-" + app + "/" + AppVersion() }

// Main is the body of a long-running app's main: usage and the environment on --help, else Run with the app build makes.
func Main[A interface{ Run(context.Context) error }](app, usage string, args, environ []string, stdout, stderr io.Writer,
	build func(context.Context, AppConfig, *slog.Logger) (A, func(), error)) int {
	if HelpAsked(args) {
		fmt.Fprint(stdout, usage)
		PrintEnv(stdout, AppConfig{}, true)
		return 0
	}
	return Run(app, environ, stderr, func(ctx context.Context, cfg AppConfig, log *slog.Logger) error {
		a, cleanup, err := build(ctx, cfg, log)
		if err != nil {
			return err
		}
		defer cleanup()
		return a.Run(ctx)
	})
}
