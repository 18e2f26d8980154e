// Command benchreport reads `go test -bench` output on stdin and prints the
// table of figures against the performance targets (make bench), then the
// peer designs' figures beside tokenguard's. It exits 1 when a target is
// missed.
package main

import (
	"fmt"
	"os"

	"github.com/tokenguard/tokenguard/tools/internal/benchreport"
)

func main() {
	r, err := benchreport.Read(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(2)
	}
	met := benchreport.Write(os.Stdout, r.Checks())
	fmt.Println()
	benchreport.WritePeers(os.Stdout, r.PeerRows())
	if !met {
		os.Exit(1)
	}
}
