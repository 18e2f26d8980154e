package di

import (
	"io"

	"github.com/tokenguard/tokenguard/infra/batch"
	"github.com/tokenguard/tokenguard/infra/tokenctl"
)

// The operator CLI reaches its package through here, like the apps.

// ErrBatchFailed: a batch round had a failed call.
var ErrBatchFailed = batch.ErrFailed

// RunTokenctl runs the operator CLI and returns its exit status.
func RunTokenctl(args, environ []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return tokenctl.Main(args, Tokenctl(environ, stderr), tokenctl.IO{Stdin: stdin, Stdout: stdout, Stderr: stderr})
}
