// Command server is the HTTP app (endpoints: infra/httpapi; configuration: docs/configuration.md).
package main

import (
	"os"

	"github.com/tokenguard/tokenguard/di"
)

const usage = "usage: server\n\nThe token API, the proxy, the connect flow and the operator console on HTTP_ADDR.\n" +
	"Migrates first unless MIGRATE_ON_START=false. Stops on SIGTERM or SIGINT.\n"

func main() {
	os.Exit(di.Main("server", usage, os.Args[1:], os.Environ(), os.Stdout, os.Stderr, di.NewServer))
}
