package dpop

import (
	"bytes"
	"crypto"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

func TestProofVerifiesWithItsEmbeddedKey(t *testing.T) {
	k, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	proof, err := k.Proof("get", "https://api.example.com/v1/items?page=2#frag", "the-access-token", "n-1", now)
	if err != nil {
		t.Fatal(err)
	}
	jws, err := jose.ParseSignedCompact(proof, []jose.SignatureAlgorithm{jose.ES256})
	if err != nil {
		t.Fatal(err)
	}
	h := jws.Signatures[0].Protected
	if h.ExtraHeaders[jose.HeaderType] != "dpop+jwt" || h.JSONWebKey == nil || !h.JSONWebKey.IsPublic() {
		t.Fatalf("header: typ %v, jwk %v", h.ExtraHeaders[jose.HeaderType], h.JSONWebKey)
	}
	payload, err := jws.Verify(h.JSONWebKey)
	if err != nil {
		t.Fatal(err)
	}
	var c claims
	if err := json.Unmarshal(payload, &c); err != nil {
		t.Fatal(err)
	}
	ath := sha256.Sum256([]byte("the-access-token"))
	want := claims{JTI: c.JTI, HTM: "GET", HTU: "https://api.example.com/v1/items", IAT: now.Unix(),
		ATH: base64.RawURLEncoding.EncodeToString(ath[:]), Nonce: "n-1"}
	if c != want || c.JTI == "" {
		t.Fatalf("claims %+v, want %+v", c, want)
	}
	tp, _ := h.JSONWebKey.Thumbprint(crypto.SHA256)
	if base64.RawURLEncoding.EncodeToString(tp) != k.Thumbprint() {
		t.Fatal("the embedded key's thumbprint is not the key's")
	}
	again, _ := k.Proof("GET", "https://api.example.com/v1/items", "", "", now)
	var c2 claims
	p2, _ := jose.ParseSignedCompact(again, []jose.SignatureAlgorithm{jose.ES256})
	_ = json.Unmarshal(p2.UnsafePayloadWithoutVerification(), &c2)
	if c2.JTI == c.JTI || c2.ATH != "" || c2.Nonce != "" {
		t.Fatalf("second proof: %+v (jti reused, or ath/nonce without a token/nonce)", c2)
	}
}

func TestKeyRoundTripsAndNeverPrints(t *testing.T) {
	k, _ := Generate()
	pem := k.MarshalPEM()
	back, err := ParsePEM(pem)
	if err != nil || back.Thumbprint() != k.Thumbprint() {
		t.Fatalf("round trip: %v, %s vs %s", err, back, k)
	}
	var logged bytes.Buffer
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("x", "key", k)
	js, _ := json.Marshal(struct{ K *Key }{k})
	body := strings.Split(string(pem), "\n")[1]
	for _, s := range []string{fmt.Sprint(k), fmt.Sprintf("%+v %#v %x %q %s", k, k, k, k, k), logged.String(), string(js),
		fmt.Sprintf("%v", struct{ k *Key }{k})} {
		if strings.Contains(s, body[:16]) || strings.Contains(s, "PRIVATE") {
			t.Fatalf("the private key printed: %s", s)
		}
	}
	if _, err := ParsePEM([]byte("-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n")); err == nil || strings.Contains(err.Error(), "c2VjcmV0") {
		t.Fatalf("bad PEM: %v", err)
	}
}

func TestNonceRefusals(t *testing.T) {
	h := http.Header{}
	h.Set("DPoP-Nonce", "n-2")
	if !NonceRefused(400, h, []byte(`{"error":"use_dpop_nonce"}`)) || NonceRefused(400, h, []byte(`{"error":"invalid_grant"}`)) {
		t.Fatal("token endpoint refusal misread")
	}
	h.Set("WWW-Authenticate", `DPoP error="use_dpop_nonce"`)
	if !NonceRefused(401, h, nil) || NonceRefused(401, http.Header{"Www-Authenticate": {`DPoP error="use_dpop_nonce"`}}, nil) {
		t.Fatal("resource refusal misread (a refusal without a nonce cannot be retried)")
	}
	var n Nonces
	n.Learn("https://AS.example.com/token?x", h)
	if n.For("https://as.example.com/other") != "n-2" || n.For("https://rs.example.com/") != "" {
		t.Fatal("nonces are per server")
	}
}

// A connect flow's key is its verifier's: the same seed, the same key;
// another seed, another key; a short seed none.
func TestDerive(t *testing.T) {
	a1, err := Derive([]byte("a-pkce-verifier-of-43-characters-0123456789"))
	if err != nil {
		t.Fatal(err)
	}
	a2, _ := Derive([]byte("a-pkce-verifier-of-43-characters-0123456789"))
	b, _ := Derive([]byte("b-pkce-verifier-of-43-characters-0123456789"))
	if a1.Thumbprint() != a2.Thumbprint() || a1.Thumbprint() == b.Thumbprint() {
		t.Fatalf("thumbprints %s %s %s", a1.Thumbprint(), a2.Thumbprint(), b.Thumbprint())
	}
	if _, err := Derive([]byte("short")); err == nil {
		t.Fatal("a short seed made a key")
	}
}

// The verifier a provider sees at the code exchange says nothing of the
// key: it is not the seed, and the key derived from it is another.
func TestDeriveVerifierIsNotTheKeysSeed(t *testing.T) {
	seed := []byte("a-pkce-verifier-of-43-characters-0123456789")
	v, err := DeriveVerifier(seed)
	if err != nil || len(v) != 43 || v == string(seed) {
		t.Fatalf("verifier %q, %v", v, err)
	}
	key, _ := Derive(seed)
	fromVerifier, _ := Derive([]byte(v))
	if key.Thumbprint() == fromVerifier.Thumbprint() {
		t.Fatal("the verifier gives the grant's key")
	}
	if again, _ := DeriveVerifier(seed); again != v {
		t.Fatal("the same seed, another verifier")
	}
}
