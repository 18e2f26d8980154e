package tokencrypt_test

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
)

// Fixed test keys (never used anywhere else).
var (
	key1 = base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 32))
	key2 = base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{2}, 32))
)

func mustRing(t testing.TB, spec string) *tokencrypt.Keyring {
	t.Helper()
	k, err := tokencrypt.ParseKeyring(spec)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

const secretValue = "rt-very-secret-value"

func TestSealOpenRoundTrip(t *testing.T) {
	k := mustRing(t, "k2="+key2+"*, k1="+key1)
	if k.Current() != "k2" || fmt.Sprint(k.IDs()) != "[k1 k2]" {
		t.Fatalf("current %q ids %v", k.Current(), k.IDs())
	}
	seen := map[string]bool{}
	for range 50 {
		s, err := k.Seal(secretValue, "acme/refresh_token")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(s, "tg1:k2:b:") || strings.Contains(s, secretValue) || !tokencrypt.IsSealed(s) || !k.IsCurrent(s) || !k.Bound(s) {
			t.Fatalf("envelope %q", s)
		}
		if seen[s] {
			t.Fatalf("two seals of one value are equal: nonce reused")
		}
		seen[s] = true
		// The nonces themselves differ, not just the ciphertexts.
		raw, _ := base64.RawURLEncoding.DecodeString(s[len("tg1:k2:b:"):])
		if seen["nonce:"+string(raw[:12])] {
			t.Fatalf("nonce reused")
		}
		seen["nonce:"+string(raw[:12])] = true
		got, err := k.Open(s, "acme/refresh_token")
		if err != nil || got != secretValue {
			t.Fatalf("Open = %q, %v", got, err)
		}
	}
	// Values sealed with an older key still open, and are not current.
	old := mustRing(t, "k1="+key1)
	s, _ := old.Seal(secretValue, "acme/access_token")
	if got, err := k.Open(s, "acme/access_token"); err != nil || got != secretValue {
		t.Fatalf("old key: Open = %q, %v", got, err)
	}
	if k.IsCurrent(s) || !old.IsCurrent(s) {
		t.Errorf("IsCurrent wrong for a value sealed with k1")
	}
	if id, ok := tokencrypt.KeyID(s); !ok || id != "k1" {
		t.Errorf("KeyID = %q, %v", id, ok)
	}
}

func TestEmptyAndLegacyValuesPassThrough(t *testing.T) {
	k := mustRing(t, "k1="+key1)
	if s, err := k.Seal("", "a/b"); err != nil || s != "" {
		t.Errorf("Seal(\"\") = %q, %v", s, err)
	}
	for _, legacy := range []string{"", "plain-token", "tg2:k1:abc", "TG1:k1:abc", "eyJhbGciOi.x.y"} {
		got, err := k.Open(legacy, "a/b")
		if err != nil || got != legacy {
			t.Errorf("Open(%q) = %q, %v; want it unchanged", legacy, got, err)
		}
		if tokencrypt.IsSealed(legacy) {
			t.Errorf("IsSealed(%q)", legacy)
		}
	}
	if k.IsCurrent("plain-token") || !k.IsCurrent("") {
		t.Errorf("IsCurrent: plaintext must need sealing, empty must not")
	}
}

func TestTamperingIsDetected(t *testing.T) {
	k := mustRing(t, "k2="+key2+"*,k1="+key1)
	s, _ := k.Seal(secretValue, "acme/refresh_token")
	// Every single-character change anywhere after the prefix: in the key
	// id, the separator, the nonce, the ciphertext or the tag.
	alphabet := "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_:="
	for i := len("tg1:"); i < len(s); i++ {
		for _, c := range []byte{alphabet[(strings.IndexByte(alphabet, s[i])+1)%len(alphabet)], 'A', '_'} {
			if c == s[i] {
				continue
			}
			bad := s[:i] + string(c) + s[i+1:]
			got, err := k.Open(bad, "acme/refresh_token")
			if !errors.Is(err, domain.ErrUndecryptable) {
				t.Fatalf("byte %d changed to %q: Open = %q, %v; want ErrUndecryptable", i, c, got, err)
			}
			assertClean(t, err.Error(), s)
		}
	}
	for name, bad := range map[string]string{
		"truncated":       s[:len(s)-1],
		"too short":       "tg1:k2:AAAA",
		"no body":         "tg1:k2:",
		"no key id":       "tg1::" + s[len("tg1:k2:"):],
		"no separator":    "tg1:k2",
		"appended":        s + "A",
		"padded":          s + "==",
		"unknown key id":  "tg1:k9:" + s[len("tg1:k2:"):],
		"bad key id":      "tg1:K2:" + s[len("tg1:k2:"):],
		"relabelled k1":   "tg1:k1:" + s[len("tg1:k2:"):],
		"prefix only":     "tg1:",
		"non-ascii body":  "tg1:k2:é" + s[len("tg1:k2:")+1:],
		"whitespace body": "tg1:k2: " + s[len("tg1:k2:")+1:],
	} {
		if _, err := k.Open(bad, "acme/refresh_token"); !errors.Is(err, domain.ErrUndecryptable) {
			t.Errorf("%s: err = %v, want ErrUndecryptable", name, err)
		}
	}
}

func TestCiphertextIsBoundToRowColumnAndKey(t *testing.T) {
	k := mustRing(t, "k2="+key2+"*,k1="+key1)
	s, _ := k.Seal(secretValue, "acme/refresh_token")
	for _, aad := range []string{"acme/access_token", "other/refresh_token", "", "acme/refresh_token "} {
		var oe *tokencrypt.OpenError
		if _, err := k.Open(s, aad); !errors.As(err, &oe) || oe.KeyID != "k2" || !errors.Is(err, domain.ErrUndecryptable) {
			t.Errorf("aad %q: err = %v, want an authentication failure", aad, err)
		}
	}
	// A ring without the key names the missing id.
	_, err := mustRing(t, "k1="+key1).Open(s, "acme/refresh_token")
	var oe *tokencrypt.OpenError
	if !errors.As(err, &oe) || oe.KeyID != "k2" || !strings.Contains(err.Error(), `"k2"`) ||
		!strings.Contains(err.Error(), "TOKEN_ENCRYPTION_KEYS") {
		t.Errorf("unknown key: err = %v", err)
	}
	// The same id with different key bytes fails authentication.
	if _, err := mustRing(t, "k2="+key1).Open(s, "acme/refresh_token"); !errors.Is(err, domain.ErrUndecryptable) {
		t.Errorf("wrong key bytes: err = %v", err)
	}
}

func TestParseKeyringErrorsNameTheVariableNotTheKey(t *testing.T) {
	short := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 16))
	unpadded := strings.TrimRight(key1, "=")
	cases := map[string]string{
		"empty":              "",
		"blank":              "  ",
		"no id":              key1,
		"bad id":             "K1=" + key1,
		"long id":            strings.Repeat("a", 33) + "=" + key1,
		"short key":          "k1=" + short,
		"not base64":         "k1=" + strings.Repeat("!", 44),
		"unpadded":           "k1=" + unpadded,
		"no current of two":  "k1=" + key1 + ",k2=" + key2,
		"two current":        "k1=" + key1 + "*,k2=" + key2 + "*",
		"duplicate id":       "k1=" + key1 + "*,k1=" + key2,
		"trailing comma":     "k1=" + key1 + ",",
		"url-safe alphabet":  "k1=" + strings.NewReplacer("+", "-", "/", "_").Replace(base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xfb}, 32))),
		"star in the middle": "k1=" + key1[:10] + "*" + key1[10:],
	}
	for name, spec := range cases {
		k, err := tokencrypt.ParseKeyring(spec)
		if err == nil {
			t.Errorf("%s: accepted as %v", name, k)
			continue
		}
		if !strings.Contains(err.Error(), "TOKEN_ENCRYPTION_KEYS") {
			t.Errorf("%s: error does not name the variable: %v", name, err)
		}
		for _, secret := range []string{key1, key2, short, unpadded, key1[:16], key2[:16]} {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("%s: error shows key material: %v", name, err)
			}
		}
	}
	// Accepted forms.
	for _, spec := range []string{"k1=" + key1, " k1 = " + key1 + " ", "a_b-9=" + key1 + " * ", "k1=" + key1 + ",k2=" + key2 + "*"} {
		if _, err := tokencrypt.ParseKeyring(spec); err != nil {
			t.Errorf("%q: %v", spec, err)
		}
	}
}

func TestKeysNeverPrint(t *testing.T) {
	spec := "k2=" + key2 + "*,k1=" + key1
	k := mustRing(t, spec)
	ks := tokencrypt.KeySpec(spec)
	var outs []string
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X"} {
		outs = append(outs, fmt.Sprintf(verb, k), fmt.Sprintf(verb, *k), fmt.Sprintf(verb, ks),
			fmt.Sprintf(verb, struct{ K tokencrypt.KeySpec }{ks}))
	}
	js, _ := json.Marshal(struct{ K tokencrypt.KeySpec }{ks})
	outs = append(outs, string(js))
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("x", "ring", k, "spec", ks)
	outs = append(outs, buf.String())
	raw1, raw2 := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	for _, out := range outs {
		for _, secret := range []string{key1, key2, key1[:12], key2[:12], string(raw1), string(raw2), fmt.Sprintf("%x", raw1[:8]), fmt.Sprintf("%x", raw2[:8]), "0x1010101", "0x2020202"} {
			if strings.Contains(out, secret) {
				t.Fatalf("key material printed: %s", out)
			}
		}
	}
	if got := fmt.Sprint(k); got != "Keyring(current=k2 keys=k1,k2)" {
		t.Errorf("String() = %q", got)
	}
}

func TestManyKeysAndRandomValues(t *testing.T) {
	var entries []string
	for i := range 5 {
		b := make([]byte, 32)
		_, _ = rand.Read(b)
		star := ""
		if i == 3 {
			star = "*"
		}
		entries = append(entries, fmt.Sprintf("key-%d=%s%s", i, base64.StdEncoding.EncodeToString(b), star))
	}
	k := mustRing(t, strings.Join(entries, ","))
	for range 100 {
		v := rand.Text() + "\x00é" + rand.Text()
		s, err := k.Seal(v, "x/y")
		if err != nil {
			t.Fatal(err)
		}
		if got, err := k.Open(s, "x/y"); err != nil || got != v {
			t.Fatalf("round trip failed: %v", err)
		}
	}
}

// assertClean fails if an error message contains the envelope body.
func assertClean(t *testing.T, msg, envelope string) {
	t.Helper()
	body := envelope[len("tg1:k2:"):]
	if strings.Contains(msg, body[:16]) || strings.Contains(msg, secretValue) {
		t.Fatalf("error shows stored data: %s", msg)
	}
}

// TestPreviousFormOpens: an envelope of the previous release (no form
// mark, additional data "tg1:<id>:" + aad) opens with its aad, is not
// Bound and not current (rotate-key reseals it); the current form does
// not open as the previous one, nor the previous as the current.
func TestPreviousFormOpens(t *testing.T) {
	k := mustRing(t, "k1="+key1)
	raw, _ := base64.StdEncoding.DecodeString(key1)
	block, _ := aes.NewCipher(raw)
	gcm, _ := cipher.NewGCM(block)
	nonce := make([]byte, 12)
	legacy := "tg1:k1:" + base64.RawURLEncoding.EncodeToString(gcm.Seal(nonce, nonce, []byte(secretValue), []byte("tg1:k1:acme/refresh_token")))
	if got, err := k.Open(legacy, "acme/refresh_token"); err != nil || got != secretValue {
		t.Fatalf("previous form: %q, %v", got, err)
	}
	if k.Bound(legacy) || k.IsCurrent(legacy) {
		t.Error("the previous form is neither bound nor current")
	}
	if _, err := k.Open("tg1:k1:b:"+legacy[len("tg1:k1:"):], "acme/refresh_token"); !errors.Is(err, domain.ErrUndecryptable) {
		t.Errorf("the previous form relabelled as bound: %v", err)
	}
	cur, _ := k.Seal(secretValue, "acme/refresh_token")
	if _, err := k.Open("tg1:k1:"+cur[len("tg1:k1:b:"):], "acme/refresh_token"); !errors.Is(err, domain.ErrUndecryptable) {
		t.Errorf("the bound form relabelled as the previous: %v", err)
	}
}
