package clientkey

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

func TestAssertionClaimsAndKeys(t *testing.T) {
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	rs, _ := rsa.GenerateKey(rand.Reader, 2048)
	for _, tc := range []struct {
		signer any
		alg    jose.SignatureAlgorithm
	}{{ec, jose.ES256}, {rs, jose.RS256}} {
		der, _ := x509.MarshalPKCS8PrivateKey(tc.signer)
		pemBytes := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
		k, err := ParsePEM(pemBytes)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Unix(1_800_000_000, 0)
		a, _ := k.Assertion("client-1", "https://as.example/token", now)
		b, _ := k.Assertion("client-1", "https://as.example/token", now)
		jws, err := jose.ParseSignedCompact(a, []jose.SignatureAlgorithm{tc.alg})
		if err != nil || jws.Signatures[0].Protected.KeyID != k.KID() {
			t.Fatalf("%s: %v", tc.alg, err)
		}
		pub := k.PublicJWK()
		payload, err := jws.Verify(&pub)
		if err != nil {
			t.Fatal(err)
		}
		var c map[string]any
		_ = json.Unmarshal(payload, &c)
		if c["iss"] != "client-1" || c["sub"] != "client-1" || c["aud"] != "https://as.example/token" ||
			c["exp"].(float64)-c["iat"].(float64) != Lifetime.Seconds() || c["jti"] == "" || a == b {
			t.Fatalf("%s claims %v (two assertions equal: %v)", tc.alg, c, a == b)
		}
		body := strings.Split(string(pemBytes), "\n")[1]
		for _, s := range []string{fmt.Sprint(k), fmt.Sprintf("%+v %#v %q %x", k, k, k, k)} {
			if strings.Contains(s, body[:16]) {
				t.Fatalf("the key printed: %s", s)
			}
		}
	}
	small, _ := rsa.GenerateKey(rand.Reader, 1024)
	if _, err := FromSigner(small); err == nil {
		t.Fatal("a 1024-bit RSA key accepted")
	}
}
