package tokencrypt_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/tokencrypt"
)

// FuzzOpen feeds arbitrary stored values to Open. It must never panic;
// a value without the prefix comes back unchanged; anything else either
// opens to what was sealed (only our own seeds can) or fails with
// ErrUndecryptable and an error that quotes none of the input's body.
// Seeds: testdata/fuzz/FuzzOpen, plus the envelopes sealed below.
func FuzzOpen(f *testing.F) {
	k := mustRing(f, "k2="+key2+"*,k1="+key1)
	old := mustRing(f, "k1="+key1)
	for _, aad := range []string{"acme/access_token", "acme/refresh_token", ""} {
		s, _ := k.Seal(secretValue, aad)
		f.Add(s, aad)
		s, _ = old.Seal("at", aad)
		f.Add(s, aad)
	}
	f.Add("", "")
	f.Add("plain-legacy-token", "acme/access_token")
	f.Add("tg1:", "a/b")
	f.Add("tg1:k2:", "a/b")
	f.Add("tg1:k9:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", "a/b")
	f.Fuzz(func(t *testing.T, stored, aad string) {
		got, err := k.Open(stored, aad)
		if !tokencrypt.IsSealed(stored) {
			if err != nil || got != stored {
				t.Fatalf("legacy value changed: %q, %v", got, err)
			}
			return
		}
		if err != nil {
			if !errors.Is(err, domain.ErrUndecryptable) {
				t.Fatalf("err = %v, want ErrUndecryptable", err)
			}
			if body := stored[len("tg1:"):]; len(body) > 40 && strings.Contains(err.Error(), body[len(body)-32:]) {
				t.Fatalf("error quotes the stored value: %v", err)
			}
			return
		}
		// Opened: it must seal and open again to the same plaintext.
		s, err := k.Seal(got, aad)
		if err != nil {
			t.Fatal(err)
		}
		if again, err := k.Open(s, aad); err != nil || again != got {
			t.Fatalf("reseal round trip: %q, %v", again, err)
		}
	})
}

// FuzzKeyringParse feeds arbitrary TOKEN_ENCRYPTION_KEYS values to
// ParseKeyring. It must never panic; errors name the variable and quote no
// key; a ring it accepts seals and opens, and prints no key.
func FuzzKeyringParse(f *testing.F) {
	f.Add("k1=" + key1)
	f.Add("k2=" + key2 + "*,k1=" + key1)
	f.Add(" k1 = " + key1 + " * , k2=" + key2)
	f.Add("k1=" + key1 + ",k2=" + key2)
	f.Add("k1=" + key1 + "*,k1=" + key2)
	f.Add("k1=" + key1[:20])
	f.Add("=,=*,*")
	f.Add("")
	f.Fuzz(func(t *testing.T, spec string) {
		k, err := tokencrypt.ParseKeyring(spec)
		// Anything that looks like key material: the text after each '='.
		var keys []string
		for _, entry := range strings.Split(spec, ",") {
			if _, key, ok := strings.Cut(entry, "="); ok {
				key = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(key), "*"))
				if len(key) >= 12 {
					keys = append(keys, key)
				}
			}
		}
		if err != nil {
			if !strings.Contains(err.Error(), tokencrypt.EnvKeys) {
				t.Fatalf("error does not name the variable: %v", err)
			}
			for _, key := range keys {
				if strings.Contains(err.Error(), key) {
					t.Fatalf("error quotes a key: %v", err)
				}
			}
			return
		}
		if !strings.Contains(strings.Join(k.IDs(), ","), k.Current()) {
			t.Fatalf("current key %q not among %v", k.Current(), k.IDs())
		}
		for _, key := range keys {
			if strings.Contains(k.String(), key) {
				t.Fatalf("String shows a key: %s", k)
			}
		}
		s, err := k.Seal("v", "a/b")
		if err != nil {
			t.Fatal(err)
		}
		if v, err := k.Open(s, "a/b"); err != nil || v != "v" || !k.IsCurrent(s) {
			t.Fatalf("round trip: %q, %v", v, err)
		}
	})
}
