// Command worker calls the external API with the connection's token for each event the server queues.
package main

import (
	"os"

	"github.com/tokenguard/tokenguard/di"
)

const usage = "usage: worker\n\nConsumes the events the server queues and, for each, calls the external API with the\n" +
	"connection's token; sends the webhooks. Stops on SIGTERM or SIGINT.\n"

func main() {
	os.Exit(di.Main("worker", usage, os.Args[1:], os.Environ(), os.Stdout, os.Stderr, di.NewWorker))
}
