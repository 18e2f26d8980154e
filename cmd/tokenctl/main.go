// Command tokenctl is the operator CLI: migrate, import, status.
package main

import (
	"os"

	"github.com/tokenguard/tokenguard/di"
	"github.com/tokenguard/tokenguard/infra/tokenctl"
)

func main() {
	stdio := tokenctl.IO{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr}
	os.Exit(tokenctl.Main(os.Args[1:], di.Tokenctl(os.Environ(), os.Stderr), stdio))
}
