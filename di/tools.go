package di

import (
	"context"
	"fmt"
	"io"
	"path/filepath"

	"github.com/tokenguard/tokenguard/infra/batch"
	"github.com/tokenguard/tokenguard/infra/benchreport"
	"github.com/tokenguard/tokenguard/infra/demo"
	"github.com/tokenguard/tokenguard/infra/sandbox"
	"github.com/tokenguard/tokenguard/infra/tokenctl"
)

// The tools in cmd/ reach their packages through here, like the apps.

// ErrBatchFailed: a batch round had a failed call.
var ErrBatchFailed = batch.ErrFailed

// RunTokenctl runs the operator CLI and returns its exit status.
func RunTokenctl(args, environ []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return tokenctl.Main(args, Tokenctl(environ, stderr), tokenctl.IO{Stdin: stdin, Stdout: stdout, Stderr: stderr})
}

// SandboxOptions configure the sandbox provider.
type SandboxOptions = sandbox.Options

// StartSandbox serves the sandbox provider on addr.
func StartSandbox(addr string, o SandboxOptions) (*demo.Sandbox, error) {
	return demo.StartSandbox(addr, o)
}

// DemoOptions configure make demo.
type DemoOptions = demo.Options

// RunDemo runs the demo, prints its table to out and writes report.json
// and report.html under o.OutDir. ok is false when a call failed or a
// refresh token was reused.
func RunDemo(ctx context.Context, o DemoOptions, out io.Writer) (ok bool, err error) {
	rep, err := demo.Run(ctx, o, out)
	if err != nil {
		return false, err
	}
	rep.PrintTable(out)
	path := filepath.Join(o.OutDir, "report.json")
	if err := rep.WriteJSON(path); err != nil {
		return false, err
	}
	page := filepath.Join(o.OutDir, "report.html")
	if err := rep.WriteHTMLFile(page); err != nil {
		return false, err
	}
	fmt.Fprintln(out, "report:", path, "and", page)
	return rep.OK, nil
}

// BenchReport reads `go test -bench` output and prints the table of
// targets; met is false when one was missed.
func BenchReport(in io.Reader, out io.Writer) (met bool, err error) {
	r, err := benchreport.Read(in)
	if err != nil {
		return false, err
	}
	return benchreport.Write(out, r.Checks()), nil
}
