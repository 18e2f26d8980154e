package tokenguard_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/tokenguard/tokenguard"
	"github.com/tokenguard/tokenguard/internal/sandbox"
)

// WithTracerProvider receives the spans of a refresh, the token
// endpoint's HTTP request among them, its URL shown without the token
// URL's query. No span carries a token or the client secret.
func TestWithTracerProvider(t *testing.T) {
	w := newWorld(t, sandbox.Options{AccessTokenLifespan: 2 * time.Second})
	tokenURL := w.oauth.Endpoint.TokenURL
	w.oauth.Endpoint.TokenURL += "?tenant=q-marker-7c1"
	sr := tracetest.NewSpanRecorder()
	tg := newTokens(t, w, w.open(t, nil), tokenguard.WithSkew(time.Second),
		tokenguard.WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))))
	ctx := context.Background()
	grant := w.grant(t)
	if err := tg.Import(ctx, "acme", grant); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(grant.Expiry.Add(-time.Second / 2))) // due, by the skew
	tok, err := tg.Token(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if st := w.provider.Stats(); st.Refreshes != 1 {
		t.Fatalf("%d refreshes, want 1", st.Refreshes)
	}
	names := map[string]int{}
	var httpURL string
	for _, s := range sr.Ended() {
		names[s.Name()]++
		for _, kv := range s.Attributes() {
			if kv.Key == attribute.Key("url.full") {
				httpURL = kv.Value.AsString()
			}
			for _, secret := range []string{grant.AccessToken, grant.RefreshToken, tok.AccessToken, w.oauth.ClientSecret, "q-marker-7c1"} {
				if strings.Contains(kv.Value.String(), secret) {
					t.Errorf("span %s attribute %s carries a secret or the query", s.Name(), kv.Key)
				}
			}
		}
	}
	for _, n := range []string{"tokenguard.token", "tokenguard.refresh", "tokenguard.lock_wait", "tokenguard.provider_call", "tokenguard.commit"} {
		if names[n] != 1 {
			t.Errorf("%d %s spans; all: %v", names[n], n, names)
		}
	}
	if httpURL != tokenURL {
		t.Errorf("the token endpoint's request shows %q, want %q", httpURL, tokenURL)
	}
}
