// Command sandbox runs the strict sandbox OAuth2 provider (see
// internal/sandbox): refresh tokens rotate on every refresh, the previous
// access token is revoked, /resource is the protected API and /stats counts
// what happened. It prints its base URL and the settings for the apps.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/tokenguard/tokenguard/internal/demo"
	"github.com/tokenguard/tokenguard/internal/sandbox"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9090", "listen `ADDR` (port 0 picks a free one)")
	lifetime := flag.Duration("access-token-lifetime", 0, "access-token lifetime (default 1h)")
	clientID := flag.String("client-id", "tokenguard", "the registered client's id")
	flag.Parse()
	sb, err := demo.StartSandbox(*addr, sandbox.Options{AccessTokenLifespan: *lifetime, ClientID: *clientID,
		ClientSecret: os.Getenv("SANDBOX_CLIENT_SECRET")})
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandbox:", err)
		os.Exit(1)
	}
	fmt.Println(sb.URL)
	fmt.Fprintf(os.Stderr, "sandbox: serving at %s; configure the apps with\n  OAUTH_TOKEN_URL=%[1]s/oauth2/token OAUTH_AUTH_URL=%[1]s/oauth2/auth API_BASE_URL=%[1]s OAUTH_CLIENT_ID=%s\n", sb.URL, *clientID)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	<-ctx.Done()
	sb.Close()
}
