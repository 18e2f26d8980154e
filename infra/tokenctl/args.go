package tokenctl

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/tokenguard/tokenguard/domain"
)

// parseFlags parses args into fs and says whether the command goes on
// (else with which exit status). Nothing unexpected the operator typed is
// printed: it may be a pasted token or secret.
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
	var known string
	fs.VisitAll(func(f *flag.Flag) {
		for _, form := range []string{"for flag -" + f.Name + ":", "for -" + f.Name + ":", "boolean flag " + f.Name + ":"} {
			if strings.Contains(msg, form) {
				known = f.Name
			}
		}
		if strings.HasPrefix(msg, "flag needs an argument: ") && strings.HasSuffix(msg, " -"+f.Name) {
			known = f.Name
		}
	})
	switch {
	case known != "" && strings.HasPrefix(msg, "flag needs an argument"):
		return "-" + known + " needs a value"
	case known != "":
		return "invalid value for -" + known + " (not shown); see -h"
	}
	return "unknown flag or bad flag syntax (not shown); see -h"
}

// checkName checks the --name of every subcommand but list.
func checkName(cmd, what, name string, fail func(int, string, ...any) int) (int, bool) {
	switch {
	case cmd == "list":
	case name == "":
		return fail(exitUsage, "%s: --name NAME is required", cmd), false
	case domain.ValidateName(name) != nil:
		return fail(exitUsage, "%s: invalid %s name %q (want 1-128 of A-Z a-z 0-9 . _ -)", cmd, what, name), false
	}
	return exitOK, true
}
