package tokenctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/tokenguard/tokenguard/domain"
)

// parseFlags parses args into fs and says whether the command goes on (else with which exit
// status). Nothing unexpected the operator typed is printed: it may be a pasted token or secret.
func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer) (int, bool) {
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	cmd := "tokenctl: " + strings.TrimPrefix(fs.Name(), "tokenctl ")
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(stderr)
		fmt.Fprintf(stderr, "usage of %s:\n", fs.Name())
		fs.PrintDefaults()
		return exitOK, false // asked for
	case err != nil:
		fmt.Fprintf(stderr, "%s: %s\n", cmd, flagProblem(fs, err))
		return exitUsage, false
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "%s: unexpected argument (not shown; secrets are read from stdin, never from the command line)\n", cmd)
		return exitUsage, false
	}
	return exitOK, true
}

// flagProblem describes a flag.Parse error without its input.
func flagProblem(fs *flag.FlagSet, err error) string {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok { // a known flag
		return "-" + name + " needs a value"
	}
	known := ""
	fs.VisitAll(func(f *flag.Flag) {
		if strings.Contains(msg, " -"+f.Name+": ") { // invalid (boolean) value %q for (flag) -name: …
			known = f.Name
		}
	})
	if known != "" {
		return "invalid value for -" + known + " (not shown); see -h"
	}
	return "unknown flag or bad flag syntax (not shown); see -h"
}

// failFunc prints "tokenctl: " and its message on stderr and returns code.
type failFunc func(code int, format string, a ...any) int

func failer(stderr io.Writer, prefix string) failFunc {
	return func(code int, format string, a ...any) int {
		fmt.Fprintf(stderr, "tokenctl: "+prefix+format+"\n", a...)
		return code
	}
}

// failed reports a backend error; configuration errors are usage errors.
func failed(fail failFunc, prefix string, err error) int {
	if ce, ok := errors.AsType[*ConfigError](err); ok {
		return fail(exitUsage, "%v", ce)
	}
	return fail(exitFailure, "%s%v", prefix, err)
}

// lookupFailed reports cmd's err: exitUsage with notFound for domain.ErrNotFound, else exitFailure.
func lookupFailed(fail failFunc, cmd string, err error, notFound string) int {
	if errors.Is(err, domain.ErrNotFound) {
		return fail(exitUsage, "%s: %s", cmd, notFound)
	}
	return fail(exitFailure, "%s: %v", cmd, err)
}

// exitFor is exitUsage for an error in the operator's input (one of usage), else exitFailure.
func exitFor(err error, usage ...error) int {
	if slices.ContainsFunc(usage, func(u error) bool { return errors.Is(err, u) }) {
		return exitUsage
	}
	return exitFailure
}

// subcommand prints the usage unless args name a subcommand, and says whether it goes on
// (else with which exit status: help asked for is not an error).
func subcommand(args []string, usage string, stderr io.Writer) (int, bool) {
	if len(args) > 0 && !slices.Contains([]string{"help", "-h", "--help"}, args[0]) {
		return exitOK, true
	}
	fmt.Fprintln(stderr, usage)
	if len(args) == 0 {
		return exitUsage, false
	}
	return exitOK, false
}

// withOpen runs fn on the stores, and closes them.
func withOpen(ctx context.Context, backend Backend, fail failFunc, fn func(*Stores) int) int {
	s, cleanup, err := backend.Open(ctx)
	if err != nil {
		return failed(fail, "", err)
	}
	defer cleanup()
	return fn(s)
}

// setFlags are the flags the command line set (even to "").
func setFlags(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

// splitList is a comma-separated list's items, trimmed, without empty ones.
func splitList(s string) []string {
	var out []string
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// checkName checks the --name of every subcommand but list.
func checkName(cmd, what, name string, fail failFunc) (int, bool) {
	switch {
	case cmd == "list":
	case name == "":
		return fail(exitUsage, "%s: --name NAME is required", cmd), false
	case domain.ValidateName(name) != nil:
		return fail(exitUsage, "%s: invalid %s name %q (want 1-128 of A-Z a-z 0-9 . _ -)", cmd, what, name), false
	}
	return exitOK, true
}
