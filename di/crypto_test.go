package di_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/tokenguard/tokenguard/di"
	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/internal/testdb"
)

var (
	diKey1 = base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0x41}, 32))
	diKey2 = base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0x42}, 32))
)

func configWith(t *testing.T, dbURL, keys string) di.Config {
	t.Helper()
	env := []string{"DATABASE_URL=" + dbURL, "OAUTH_TOKEN_URL=http://127.0.0.1:1/token", "OAUTH_CLIENT_ID=c"}
	if keys != "" {
		// While encryption is turned on plaintext rows are still read
		// (they are refused by default once keys are set).
		env = append(env, "TOKEN_ENCRYPTION_KEYS="+keys, "TOKEN_ENCRYPTION_REQUIRED=false")
	}
	c, err := di.ConfigFromEnv(env)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestEncryptionKeysConfig(t *testing.T) {
	base := []string{"DATABASE_URL=postgres://db/x"}
	for name, keys := range map[string]string{
		"no id":       diKey1,
		"short key":   "k1=" + diKey1[:20],
		"two current": "k1=" + diKey1 + "*,k2=" + diKey2 + "*",
		"no current":  "k1=" + diKey1 + ",k2=" + diKey2,
	} {
		_, err := di.ConfigFromEnv(append(base, "TOKEN_ENCRYPTION_KEYS="+keys))
		if err == nil || !strings.Contains(err.Error(), "TOKEN_ENCRYPTION_KEYS") {
			t.Errorf("%s: err = %v, want one naming TOKEN_ENCRYPTION_KEYS", name, err)
		} else if strings.Contains(err.Error(), diKey1[:12]) || strings.Contains(err.Error(), diKey2[:12]) {
			t.Errorf("%s: error shows a key: %v", name, err)
		}
	}
	c := configWith(t, "postgres://u:pw@db/x", "k2="+diKey2+"*,k1="+diKey1)
	if !strings.Contains(c.String(), "encryption:current=k2") {
		t.Errorf("String() = %s", c)
	}
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("cfg", "config", c, "raw", any(c.EncryptionKeys))
	for _, out := range []string{c.String(), fmt.Sprintf("%v", c), fmt.Sprintf("%+v", c), fmt.Sprintf("%#v", c), fmt.Sprint(c.EncryptionKeys), buf.String()} {
		if strings.Contains(out, diKey1[:12]) || strings.Contains(out, diKey2[:12]) {
			t.Errorf("configuration output shows a key: %s", out)
		}
	}
	if off := configWith(t, "postgres://db/x", ""); !strings.Contains(off.String(), "encryption:off") {
		t.Errorf("String() = %s", off)
	}
}

func TestStartUpChecksKeysAndRotateKeyReseals(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	ctx := context.Background()
	url := testdb.New(t)
	grant := domain.Grant{AccessToken: domain.NewSecret("at-1"), RefreshToken: domain.NewSecret("rt-1")}
	k1 := "k1=" + diKey1
	k2 := "k2=" + diKey2

	// A plaintext row from before encryption, then one sealed with k1.
	for id, keys := range map[string]string{"legacy": "", "acme": k1} {
		s, cleanup, err := di.NewStore(ctx, configWith(t, url, keys), nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Connect.Connect(ctx, id, grant); err != nil {
			t.Fatal(err)
		}
		cleanup()
	}

	start := func(keys string) (string, error) {
		var buf bytes.Buffer
		tokens, cleanup, err := di.NewTokens(ctx, configWith(t, url, keys), slog.New(slog.NewTextHandler(&buf, nil)), di.TokenOptions{})
		if err == nil {
			tok, getErr := tokens.Repository.Get(ctx, "acme")
			if getErr != nil || tok.RefreshToken.Reveal() != "rt-1" {
				t.Errorf("started with %q but Get = %v", keys, getErr)
			}
			cleanup()
		}
		return buf.String(), err
	}
	for name, keys := range map[string]string{"k1 missing": k2, "no keys": "", "k1 replaced": "k1=" + diKey2} {
		_, err := start(keys)
		if !errors.Is(err, domain.ErrUndecryptable) || !strings.Contains(err.Error(), "TOKEN_ENCRYPTION_KEYS") ||
			!strings.Contains(err.Error(), `"k1"`) {
			t.Errorf("%s: start-up err = %v, want one naming TOKEN_ENCRYPTION_KEYS and k1", name, err)
		}
	}
	logged, err := start(k2 + "*," + k1)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logged, "rotate-key") {
		t.Errorf("no warning about rows waiting for rotate-key:\n%s", logged)
	}

	if _, err := di.Reseal(ctx, configWith(t, url, ""), nil); err == nil || !strings.Contains(err.Error(), "TOKEN_ENCRYPTION_KEYS") {
		t.Errorf("rotate-key without keys: err = %v", err)
	}
	res, err := di.Reseal(ctx, configWith(t, url, k2+"*,"+k1), nil)
	if err != nil || res.Resealed != 2 || res.Current != 0 {
		t.Fatalf("Reseal = %+v, %v", res, err)
	}
	// k1 is no longer needed, and nothing waits for rotate-key.
	logged, err = start(k2)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logged, "level=WARN") {
		t.Errorf("unexpected warning:\n%s", logged)
	}
}

func TestStartUpWarnsAboutPlaintext(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	var buf bytes.Buffer
	_, cleanup, err := di.NewTokens(context.Background(), configWith(t, testdb.New(t), ""), slog.New(slog.NewTextHandler(&buf, nil)), di.TokenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cleanup()
	if !strings.Contains(buf.String(), "level=WARN") || !strings.Contains(buf.String(), "stored in plaintext") {
		t.Errorf("no plaintext warning:\n%s", buf.String())
	}
}
