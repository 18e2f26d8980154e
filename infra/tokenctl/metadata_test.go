package tokenctl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/di"
	"github.com/tokenguard/tokenguard/internal/sandbox"
)

// importToken runs tokenctl import with a fresh sandbox grant on stdin.
func (c *cli) importToken(args ...string) (result, string) {
	c.t.Helper()
	tok, err := sandbox.Grant(context.Background(), c.p.OAuth2Config(c.srv.URL))
	if err != nil {
		c.t.Fatal(err)
	}
	body, _ := json.Marshal(tok)
	var stdout, stderr bytes.Buffer
	code := di.RunTokenctl(append([]string{"import"}, args...), c.environ, bytes.NewReader(body), &stdout, &stderr)
	return result{code, stdout.String(), stderr.String()}, tok.RefreshToken
}

// Metadata given to import is shown by status; a later import without
// metadata keeps it, one with metadata replaces it; bad metadata is refused
// with nothing stored, neither the token nor the metadata.
func TestImportMetadata(t *testing.T) {
	c := newCLI(t, time.Hour)
	r, _ := c.importToken("--connection", "acme", "--metadata", `{"tenant":"t1","user":"u7"}`, "--tags", "crm,eu")
	if r.code != 0 {
		t.Fatalf("import: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	status := func() string {
		t.Helper()
		r := c.run(c.environ, "status", "--connection", "acme")
		if r.code != 0 {
			t.Fatalf("status: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
		return r.stdout
	}
	if s := status(); !strings.Contains(s, "\nacme: metadata {\"user\":\"u7\",\"tenant\":\"t1\"}; tags crm,eu\n") {
		t.Errorf("status:\n%s", s)
	}
	if r, _ := c.importToken("--connection", "acme"); r.code != 0 {
		t.Fatalf("import without metadata: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if s := status(); !strings.Contains(s, "acme: metadata {\"user\":\"u7\",\"tenant\":\"t1\"}; tags crm,eu\n") {
		t.Errorf("metadata lost by an import without it:\n%s", s)
	}

	stored := c.row("acme")
	for _, bad := range [][]string{
		{"--metadata", `{"tenant":`},                                  // not JSON
		{"--metadata", `["t1"]`},                                      // not an object
		{"--metadata", `{"x":"` + strings.Repeat("a", 17<<10) + `"}`}, // over 16 KiB
		{"--tags", "ok,has space"},                                    // a malformed tag
	} {
		r, _ := c.importToken(append([]string{"--connection", "acme"}, bad...)...)
		if r.code != 2 || !strings.Contains(r.stderr, "invalid connection metadata") || !strings.Contains(r.stderr, "nothing stored") {
			t.Errorf("%.40v: exit %d\n%s%s", bad, r.code, r.stdout, r.stderr)
		}
		if strings.Contains(r.stderr, "aaaa") || strings.Contains(r.stderr, "has space") {
			t.Errorf("%.40v: the error quotes the input: %s", bad, r.stderr)
		}
	}
	if got := c.row("acme"); got != stored {
		t.Errorf("stored after refused imports %+v, before %+v", got, stored)
	}
	// Tags count once however often they are given.
	if r, _ := c.importToken("--connection", "acme", "--metadata", "", "--tags", strings.Repeat("t,", 40)+"t33"); r.code != 0 {
		t.Errorf("repeated tags: exit %d\n%s", r.code, r.stderr)
	}
	var tags []string
	for i := range 33 {
		tags = append(tags, "t"+strings.Repeat("x", i))
	}
	if r, _ := c.importToken("--connection", "acme", "--tags", strings.Join(tags, ",")); r.code != 2 || !strings.Contains(r.stderr, "33 tags, at most 32") {
		t.Errorf("33 tags: exit %d\n%s", r.code, r.stderr)
	}
	if s := status(); !strings.Contains(s, "acme: metadata {}; tags t,t33\n") {
		t.Errorf("status after the refused imports:\n%s", s)
	}
	// A new connection refused for its metadata is not created.
	if r, _ := c.importToken("--connection", "fresh", "--metadata", `[1]`); r.code != 2 {
		t.Errorf("fresh with bad metadata: exit %d", r.code)
	}
	if !c.gone("fresh") {
		t.Error("a connection was stored with refused metadata")
	}
}
