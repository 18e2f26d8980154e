package tokenctl_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
	"github.com/tokenguard/tokenguard/repository"
)

// The sender-constraint flags of provider add/update: --par, --resource,
// --auth-style private_key_jwt --client-key-file. Bad values are usage
// errors that name the flag and store nothing; the key is sealed at rest
// (the column never holds the PEM) and opens to the file's key.
func TestProviderSenderConstraintFlags(t *testing.T) {
	c := newCLI(t, 0)
	ctx := context.Background()
	spec := "k1=" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{9}, 32))
	c.environ = append(c.environ, "TOKEN_ENCRYPTION_KEYS="+spec)
	keys, err := tokencrypt.ParseKeyring(spec)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.MarshalPKCS8PrivateKey(ec)
	ecPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	ecFile := write("ec.pem", ecPEM)
	weak, _ := rsa.GenerateKey(rand.Reader, 1024)
	weakFile := write("weak.pem", pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(weak)}))
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	der384, _ := x509.MarshalPKCS8PrivateKey(p384)
	p384File := write("p384.pem", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der384}))
	garbage := write("garbage.pem", []byte("not a key at all"))

	oc := c.p.OAuth2Config(c.srv.URL)
	base := []string{"provider", "add", "--name", "pk", "--token-url", oc.Endpoint.TokenURL, "--client-id", oc.ClientID}
	with := func(extra ...string) []string { return append(append([]string{}, base...), extra...) }
	for name, tc := range map[string]struct {
		stdin string
		args  []string
		want  string
	}{
		"par bad":                {"s\n", with("--par", "sometimes"), "--par: invalid provider: par must be auto, always or never"},
		"par empty":              {"s\n", with("--par", ""), "--par"},
		"resource not http":      {"s\n", with("--resource", "urn:x"), "resource must be an http(s) URL"},
		"key without style":      {"", with("--client-key-file", ecFile), "--auth-style private_key_jwt and --client-key-file PATH go together"},
		"style without key":      {"", with("--auth-style", "private_key_jwt"), "--auth-style private_key_jwt and --client-key-file PATH go together"},
		"key file missing":       {"", with("--auth-style", "private_key_jwt", "--client-key-file", filepath.Join(dir, "none.pem")), "--client-key-file: cannot read the key file"},
		"key not a key":          {"", with("--auth-style", "private_key_jwt", "--client-key-file", garbage), "not a PEM EC P-256 or RSA"},
		"key rsa 1024":           {"", with("--auth-style", "private_key_jwt", "--client-key-file", weakFile), "not a PEM EC P-256 or RSA"},
		"key p384":               {"", with("--auth-style", "private_key_jwt", "--client-key-file", p384File), "not a PEM EC P-256 or RSA"},
		"auth style bad":         {"s\n", with("--auth-style", "jwt"), "auth style must be auto, header, params or private_key_jwt"},
		"update unknown par":     {"", []string{"provider", "update", "--name", "pk", "--par", "maybe"}, "--par"},
		"update style needs key": {"", []string{"provider", "update", "--name", "nobody", "--auth-style", "private_key_jwt"}, "unknown provider"},
	} {
		t.Run(name, func(t *testing.T) {
			r := c.runIn(tc.stdin, tc.args...)
			if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
				t.Fatalf("%v: code %d, stderr %q; want 2 and %q", tc.args, r.code, r.stderr, tc.want)
			}
			if strings.Contains(r.stderr, "BEGIN") {
				t.Fatalf("the key file was echoed: %q", r.stderr)
			}
		})
	}
	providers := repository.NewProviderRepository(c.db, keys)
	if list, _ := providers.List(ctx); len(list) != 0 {
		t.Fatalf("a refused command stored a provider: %v", list)
	}

	// Added with a key and no secret on stdin; then the options change.
	if r := c.runIn("", with("--auth-style", "private_key_jwt", "--client-key-file", ecFile, "--resource", "https://api.example.com", "--par", "always")...); r.code != 0 {
		t.Fatalf("add with a client key: %+v", r)
	}
	p, err := providers.Get(ctx, "pk")
	if err != nil {
		t.Fatal(err)
	}
	if p.AuthStyle != domain.AuthStylePrivateKeyJWT || p.ClientKey.Reveal() != string(ecPEM) || p.Resource != "https://api.example.com" || p.PAR != domain.PARAlways {
		t.Fatalf("stored: style %s, key matches %v, resource %q, par %q", p.AuthStyle, p.ClientKey.Reveal() == string(ecPEM), p.Resource, p.PAR)
	}
	var raw string
	if err := c.db.Raw("SELECT client_key FROM tokenguard_providers WHERE name = 'pk'").Scan(&raw).Error; err != nil || raw == "" || strings.Contains(raw, "PRIVATE KEY") {
		t.Fatalf("client_key at rest: %v, sealed %v", err, !strings.Contains(raw, "PRIVATE KEY"))
	}
	if r := c.runIn("", "provider", "update", "--name", "pk", "--par", "never", "--resource", ""); r.code != 0 {
		t.Fatalf("update par and resource: %+v", r)
	}
	if p, _ = providers.Get(ctx, "pk"); p.PAR != domain.PARNever || p.Resource != "" || p.ClientKey.IsZero() {
		t.Fatalf("after update: par %q, resource %q, key kept %v", p.PAR, p.Resource, !p.ClientKey.IsZero())
	}
	// Another style drops the key (a secret comes with it).
	if r := c.runIn("new-secret\n", "provider", "update", "--name", "pk", "--auth-style", "params", "--client-secret-stdin"); r.code != 0 {
		t.Fatalf("update to params: %+v", r)
	}
	if p, _ = providers.Get(ctx, "pk"); p.AuthStyle != domain.AuthStyleParams || !p.ClientKey.IsZero() {
		t.Fatalf("after params: style %s, key left %v", p.AuthStyle, !p.ClientKey.IsZero())
	}
}
