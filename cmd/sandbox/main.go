// Command sandbox runs the strict sandbox OAuth2 provider (see
// internal/sandbox): refresh tokens rotate on every refresh, the previous
// access token is revoked, /resource is the protected API and /stats counts
// what happened. It prints every setting the apps need and the command that
// gets a first token.
//
//	sandbox [--addr 127.0.0.1:9090] [--access-token-lifetime 1h]
//	sandbox grant [--url http://127.0.0.1:9090]   # a first token, as tokenctl import reads it
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/internal/demo"
	"github.com/tokenguard/tokenguard/internal/sandbox"
)

const (
	defaultClientID = "tokenguard"
	defaultSecret   = "tokenguard-secret"
	// The server's callback (HTTP_ADDR's default); the sandbox accepts any
	// loopback redirect.
	redirectURL = "http://127.0.0.1:8080/oauth/callback"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "grant" {
		os.Exit(grant(os.Args[2:]))
	}
	addr := flag.String("addr", "127.0.0.1:9090", "listen `ADDR` (port 0 picks a free one)")
	lifetime := flag.Duration("access-token-lifetime", 0, "access-token lifetime (default 1h)")
	clientID := flag.String("client-id", defaultClientID, "the registered client's id")
	flag.Parse()
	secret := os.Getenv("SANDBOX_CLIENT_SECRET")
	if secret == "" {
		secret = defaultSecret
	}
	sb, err := demo.StartSandbox(*addr, sandbox.Options{AccessTokenLifespan: *lifetime, ClientID: *clientID, ClientSecret: secret})
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandbox:", err)
		os.Exit(1)
	}
	fmt.Println(sb.URL)
	fmt.Fprintf(os.Stderr, `sandbox: serving at %[1]s. Settings for the apps:
  export OAUTH_TOKEN_URL=%[1]s/oauth2/token OAUTH_AUTH_URL=%[1]s/oauth2/auth API_BASE_URL=%[1]s
  export OAUTH_CLIENT_ID=%[2]s OAUTH_CLIENT_SECRET=%[3]s OAUTH_REDIRECT_URL=%[4]s OAUTH_SCOPES=api
A first token for connection "acme":
  bin/sandbox grant --url %[1]s | bin/tokenctl import --connection acme
`, sb.URL, *clientID, secret, redirectURL)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	<-ctx.Done()
	sb.Close()
}

// grant runs the authorization-code flow at a running sandbox and prints
// the token as x/oauth2 JSON (what tokenctl import reads).
func grant(args []string) int {
	fs := flag.NewFlagSet("sandbox grant", flag.ContinueOnError)
	base := fs.String("url", "http://127.0.0.1:9090", "the sandbox's `URL`")
	clientID := fs.String("client-id", defaultClientID, "the registered client's id")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	secret := os.Getenv("SANDBOX_CLIENT_SECRET")
	if secret == "" {
		secret = defaultSecret
	}
	cfg := &oauth2.Config{ClientID: *clientID, ClientSecret: secret, Endpoint: sandbox.Endpoint(*base),
		RedirectURL: redirectURL, Scopes: []string{"api"}}
	tok, err := sandbox.Grant(context.Background(), cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandbox grant:", err)
		return 1
	}
	if err := json.NewEncoder(os.Stdout).Encode(tok); err != nil {
		fmt.Fprintln(os.Stderr, "sandbox grant:", err)
		return 1
	}
	return 0
}
