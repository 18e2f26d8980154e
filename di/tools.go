package di

import (
	"fmt"
	"io"

	"github.com/tokenguard/tokenguard/infra/batch"
	"github.com/tokenguard/tokenguard/infra/tokenctl"
)

// The operator CLI reaches its package through here, like the apps.

// ErrBatchFailed: a batch round had a failed call.
var ErrBatchFailed = batch.ErrFailed

// RunTokenctl runs the operator CLI and returns its exit status.
func RunTokenctl(args, environ []string, stdin io.Reader, stdout, stderr io.Writer) int {
	// Only check sends the client secret; the other commands do without.
	for _, w := range envWarnings(environ, len(args) > 0 && args[0] == "check") {
		fmt.Fprintf(stderr, "tokenctl: warning: %s\n", w.Message)
	}
	return tokenctl.Main(args, Tokenctl(environ, stderr), tokenctl.IO{Stdin: stdin, Stdout: stdout, Stderr: stderr})
}
