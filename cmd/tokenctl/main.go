// Command tokenctl is the operator CLI: migrate, import, status, rotate-key, reactivate, check.
package main

import (
	"os"

	"github.com/tokenguard/tokenguard/di"
)

func main() {
	os.Exit(di.RunTokenctl(os.Args[1:], os.Environ(), os.Stdin, os.Stdout, os.Stderr))
}
