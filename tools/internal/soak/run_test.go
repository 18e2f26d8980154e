package soak

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestShortSoak runs the soak for 25 s (faults, the apps as OS processes
// under load, a throw-away cluster): every invariant holds, and the table
// has the DPoP-bound connection's row, whose grant the apps refreshed and
// called with proofs the sandbox verified. go test -short skips it.
func TestShortSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("a 25 s soak with the apps built as processes")
	}
	bin := t.TempDir()
	if out, err := exec.Command("go", "build", "-o", bin+"/", "github.com/tokenguard/tokenguard/cmd/server", "github.com/tokenguard/tokenguard/cmd/worker",
		"github.com/tokenguard/tokenguard/cmd/batch", "github.com/tokenguard/tokenguard/cmd/tokenctl").CombinedOutput(); err != nil {
		t.Fatalf("go build the apps: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var out bytes.Buffer
	rep, err := Run(ctx, Options{BinDir: bin, OutDir: t.TempDir(), Duration: 25 * time.Second, TokenLifetime: 2 * time.Second, FaultGap: 6 * time.Second}, &out)
	if err != nil {
		t.Fatalf("soak: %v\n%s", err, out.String())
	}
	rep.Print(&out)
	t.Log(out.String())
	var row *Invariant
	for i, inv := range rep.Invariants {
		if strings.Contains(inv.Name, dpopConnection) {
			row = &rep.Invariants[i]
		}
	}
	switch {
	case row == nil:
		t.Errorf("the invariant table has no row for the DPoP-bound connection")
	case !row.OK:
		t.Errorf("DPoP-bound connection: %s", row.Value)
	case rep.Provider.DPoPBound != 1:
		t.Errorf("grants bound at the sandbox: %d, want 1", rep.Provider.DPoPBound)
	}
	if !rep.OK {
		t.Errorf("the soak failed: %v", rep.Problems)
	}
}
