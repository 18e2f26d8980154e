package tokenctl_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/infra/dpop"
)

// tokenctl import --dpop-key-file stores the grant bound to the key:
// status shows the binding as the key's thumbprint, never the key; a file
// that is not a key is refused with nothing stored, without quoting it.
func TestImportDPoPKey(t *testing.T) {
	c := newCLI(t, time.Hour)
	k, _ := dpop.Generate()
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "key.pem")
	pem := k.MarshalPEM()
	if err := os.WriteFile(keyFile, pem, 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.pem")
	_ = os.WriteFile(bad, []byte("not-a-key-secretish"), 0o600)
	if r, _ := c.importToken("--connection", "bound", "--dpop-key-file", bad); r.code != 2 || strings.Contains(r.stderr, "secretish") ||
		!strings.Contains(r.stderr, "nothing stored") {
		t.Fatalf("a bad key file: exit %d\n%s", r.code, r.stderr)
	}
	if r := c.run(c.environ, "status", "--connection", "bound"); r.code == 0 {
		t.Fatalf("a refused import stored the connection:\n%s", r.stdout)
	}
	if r, _ := c.importToken("--connection", "bound", "--dpop-key-file", keyFile); r.code != 0 {
		t.Fatalf("import: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r := c.run(c.environ, "status")
	body := strings.Split(string(pem), "\n")[1]
	if r.code != 0 || !strings.Contains(r.stdout, "bound: bound to dpop key "+k.Thumbprint()) || strings.Contains(r.stdout+r.stderr, body[:20]) {
		t.Fatalf("status: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}
