package tokenctl_test

import (
	"strings"
	"testing"
)

// TestNothingUnexpectedIsEchoed: a secret typed where tokenctl expects no
// such argument (as a command, a stray argument, an unknown flag, a
// flag's refused value) is refused with status 2 and appears in neither
// stdout nor stderr. The control shows the check sees an echo: the one
// value tokenctl is meant to print back (a key name) is found.
func TestNothingUnexpectedIsEchoed(t *testing.T) {
	c := newCLI(t, 0)
	const secret = "tgk_Zq9Xv7wqplmMARK0123456789abcdefZq9X"
	for _, args := range [][]string{
		{secret},
		{"status", secret},
		{"status", "--" + secret},
		{"status", "--" + secret + "=x"},
		{"status", "-connection"},
		{"import", "--connection", "acme", secret},
		{"disconnect", "--revoke=" + secret, "--connection", "acme"},
		{"apikey", secret},
		{"apikey", "create", "--name", "k", secret},
		{"apikey", "create", "--" + secret},
		{"apikey", "create", "--name", "k", "--scopes", secret},
		{"apikey", "create", "--name", "k", "--connections", "a," + secret + "[x"},
		{"apikey", "list", secret},
		{"provider", secret},
		{"provider", "add", "--name", "p", "--token-url", "https://p.example/token", "--client-id", "c", secret},
		{"provider", "update", "--name", "p", "--skew", secret},
		{"provider", "list", "--" + secret},
	} {
		r := c.run(c.environ, args...)
		if r.code != 2 || strings.Contains(r.stdout+r.stderr, "Zq9X") {
			t.Errorf("tokenctl %v: exit %d, stdout %q, stderr %q: want 2 and no echo", args, r.code, r.stdout, r.stderr)
		}
	}
	// Control: what tokenctl does print back is seen.
	if r := c.run(c.environ, "apikey", "create", "--name", "SECRETname"); r.code != 0 || !strings.Contains(r.stderr, "SECRETname") {
		t.Errorf("control: apikey create --name SECRETname: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestAPIKeyScopesListed: apikey create takes --connections and
// --scopes, refuses unknown scopes, warns about a pattern that matches no
// name, and apikey list shows what each key may do ("all" for a key of
// every right).
func TestAPIKeyScopesListed(t *testing.T) {
	c := newCLI(t, 0)
	if r := c.run(c.environ, "migrate"); r.code != 0 {
		t.Fatalf("migrate: %d %s", r.code, r.stderr)
	}
	if r := c.run(c.environ, "apikey", "create", "--name", "full"); r.code != 0 {
		t.Fatalf("create full: %d %s", r.code, r.stderr)
	}
	r := c.run(c.environ, "apikey", "create", "--name", "tenant", "--connections", "tenant-a-*,solo", "--scopes", "token:read,api:call")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "tgk_") {
		t.Fatalf("create tenant: %d %s %s", r.code, r.stdout, r.stderr)
	}
	if r := c.run(c.environ, "apikey", "create", "--name", "bad", "--scopes", "token:read,root"); r.code != 2 || !strings.Contains(r.stderr, "scope 2 is not one of") {
		t.Errorf("unknown scope: %d %s", r.code, r.stderr)
	}
	if r := c.run(c.environ, "apikey", "create", "--name", "slash", "--connections", "tenant-a/*"); r.code != 0 || !strings.Contains(r.stderr, "matches no connection") {
		t.Errorf("a pattern with a slash: %d %s", r.code, r.stderr)
	}
	r = c.run(c.environ, "apikey", "list")
	lines := strings.Split(r.stdout, "\n")
	if r.code != 0 || !strings.Contains(lines[0], "SCOPES") || !strings.Contains(lines[0], "CONNECTIONS") {
		t.Fatalf("list: %d %s", r.code, r.stdout)
	}
	for _, want := range [][3]string{{"full", "all", "all"}, {"tenant", "token:read,api:call", "tenant-a-*,solo"}} {
		found := false
		for _, l := range lines {
			f := strings.Fields(l)
			if len(f) >= 5 && f[0] == want[0] && f[len(f)-2] == want[1] && f[len(f)-1] == want[2] {
				found = true
			}
		}
		if !found {
			t.Errorf("list has no line %v:\n%s", want, r.stdout)
		}
	}
}
