package tokenguard_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"sync"
	"testing"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard"
	"github.com/tokenguard/tokenguard/internal/sandbox"
)

// A consent's grant is kept sealed and pending; of two redemptions at once
// exactly one stores it; a wrong state or a replay stores nothing; a
// result nobody redeemed is revoked at the provider and deleted.
func TestConnectFlowPendingUntilRedeemed(t *testing.T) {
	w := newWorld(t, sandbox.Options{})
	w.oauth.Endpoint.AuthStyle = oauth2.AuthStyleInHeader
	db := w.open(t, nil)
	tg := newTokens(t, w, db, tokenguard.WithEncryptionKeys(testKeys), tokenguard.WithRevocationURL(sandbox.RevocationURL(w.srv.URL)), tokenguard.WithUserInfo(w.srv.URL+"/userinfo", ""))
	ctx := context.Background()

	authURL, flow, err := tg.AuthCodeURL(ctx, tokenguard.ConnectFlow{Connection: "acme", Metadata: []byte(`{"tenant":"t1"}`)})
	if err != nil || !strings.Contains(authURL, "prompt=consent") || !strings.Contains(authURL, "code_challenge=") || flow.State == "" || flow.Verifier == "" {
		t.Fatalf("AuthCodeURL: %q %+v %v", authURL, flow, err)
	}
	callback := consent(authURL)
	forged := url.Values{"code": {callback.Get("code")}, "state": {"forged"}}
	var ce *tokenguard.ConnectError
	if _, err := tg.Complete(ctx, flow, forged); !errors.As(err, &ce) || ce.Code != "bad_state" {
		t.Errorf("Complete with another state: %v", err)
	}
	res, err := tg.Complete(ctx, flow, callback)
	if err != nil || !strings.HasPrefix(res.Code, "tgr_") || res.Account != sandbox.Subject {
		t.Fatalf("Complete: %+v %v", res, err)
	}
	var stored string
	if err := db.Raw("SELECT access_token || refresh_token FROM tokenguard_connect_results").Scan(&stored).Error; err != nil {
		t.Fatal(err)
	}
	if strings.Contains(stored, "ory_") { // the sandbox's tokens start so
		t.Errorf("the pending grant is stored in plaintext: %.40s…", stored)
	}
	if conns, _, _ := tg.Connections(ctx, "", 10); len(conns) != 0 {
		t.Errorf("connections before the redemption: %+v", conns)
	}

	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Go(func() { _, errs[i] = tg.Redeem(ctx, res.Code) })
	}
	wg.Wait()
	if (errs[0] == nil) == (errs[1] == nil) || !(errors.Is(errs[0], tokenguard.ErrResultInvalid) || errors.Is(errs[1], tokenguard.ErrResultInvalid)) {
		t.Errorf("two redemptions at once: %v, %v; want one stored, one ErrResultInvalid", errs[0], errs[1])
	}
	conns, _, err := tg.Connections(ctx, "", 10)
	if err != nil || len(conns) != 1 || conns[0].Account != sandbox.Subject || string(conns[0].Metadata) != `{"tenant":"t1"}` {
		t.Fatalf("after the redemption: %+v %v", conns, err)
	}

	// A second consent nobody redeems: expired, swept, revoked.
	authURL, flow, _ = tg.AuthCodeURL(ctx, tokenguard.ConnectFlow{Connection: "acme"})
	res, err = tg.Complete(ctx, flow, consent(authURL))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := tg.SweepConnectResults(ctx); err != nil || n != 0 {
		t.Errorf("sweep before the expiry: %d %v", n, err)
	}
	if err := db.Exec("UPDATE tokenguard_connect_results SET expires_at = now() - interval '1 second'").Error; err != nil {
		t.Fatal(err)
	}
	revocations := w.provider.Stats().Revocations
	if _, err := tg.Redeem(ctx, res.Code); !errors.Is(err, tokenguard.ErrResultInvalid) {
		t.Errorf("redeem after the expiry: %v", err)
	}
	if n, err := tg.SweepConnectResults(ctx); err != nil || n != 1 || w.provider.Stats().Revocations != revocations+1 {
		t.Errorf("sweep after the expiry: %d %v, revocations %d → %d", n, err, revocations, w.provider.Stats().Revocations)
	}
	var left int
	if err := db.Raw("SELECT count(*) FROM tokenguard_connect_results").Scan(&left).Error; err != nil || left != 0 {
		t.Errorf("results left after the sweep: %d %v", left, err)
	}
}
