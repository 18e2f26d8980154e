package conformance_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard"
)

// TestResourceIndicator: with WithResource (OAUTH_RESOURCE) the connect
// flow's authorization request, its code exchange and every refresh name
// the resource (RFC 8707), and oidc-provider issues access tokens whose
// audience is that resource.
func TestResourceIndicator(t *testing.T) {
	const resource = "https://api.conformance.example/"
	w := newSenderWorld(t, 1, "dpop-public", []string{"RESOURCE=" + resource}, tokenguard.WithDPoP(), tokenguard.WithResource(resource))
	tg := w.stacks[0]
	w.connect(t, tg, "res-conn")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	first, err := tg.Repository().Get(ctx, "res-conn")
	if err != nil {
		t.Fatal(err)
	}
	if aud := w.audience(t, first.AccessToken.Reveal()); aud != resource {
		t.Errorf("the connect flow's access token is for %q, want %q", aud, resource)
	}
	if _, err := tg.ForceRefresh(ctx, "res-conn", first.Version); err != nil {
		t.Fatalf("refresh: %v", err)
	}
	cur, _ := tg.Repository().Get(ctx, "res-conn")
	if aud := w.audience(t, cur.AccessToken.Reveal()); aud != resource || cur.Version == first.Version {
		t.Errorf("the refreshed access token (version %d) is for %q, want %q", cur.Version, aud, resource)
	}
	// Control: without the option, the same flow's token is not for the resource.
	plain, err := tokenguard.New(w.openDB(t), w.cfg, tokenguard.WithDPoP(), tokenguard.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	w.connect(t, plain, "plain-conn")
	other, _ := plain.Repository().Get(ctx, "plain-conn")
	if aud := w.audience(t, other.AccessToken.Reveal()); aud == resource {
		t.Errorf("control: a token obtained without the resource indicator is for %q too", aud)
	}
}

// audience asks the server's introspection who an access token is for.
func (w *dpopWorld) audience(t *testing.T, token string) string {
	req, _ := http.NewRequest(http.MethodPost, w.d.Introspection, strings.NewReader(url.Values{"token": {token}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth("resource-server", clientSecret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Active bool `json:"active"`
		Aud    any  `json:"aud"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&body)
	if !body.Active {
		return "(inactive)"
	}
	if s, ok := body.Aud.(string); ok {
		return s
	}
	b, _ := json.Marshal(body.Aud)
	return string(b)
}
