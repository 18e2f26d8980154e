// Command sandbox runs the strict sandbox OAuth2 provider (see
// internal/sandbox): refresh tokens rotate on every refresh, the previous
// access token is revoked, /resource is the protected API and /stats counts
// what happened. It prints every setting the apps need and the command that
// gets a first token. Quirks of real providers are flags: a token endpoint
// that takes the client's credentials only one way (--auth-style), answers
// without expires_in (--omit-expires-in). The client secret is
// SANDBOX_CLIENT_SECRET (default tokenguard-secret).
//
//	sandbox [--addr 127.0.0.1:9090] [--access-token-lifetime 1h] [--client-id ID]
//	        [--auth-style header|params|both] [--omit-expires-in] [--scopes "a b"]
//	        [--refresh-scope "a"] [--omit-refresh-scope]
//	sandbox grant [--url http://127.0.0.1:9090] [--client-id ID]   # a first token, as tokenctl import reads it
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/infra/provider/profiles"
	"github.com/tokenguard/tokenguard/internal/sandbox"
	"github.com/tokenguard/tokenguard/tools/internal/demo"
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
		os.Exit(grant(os.Args[2:], os.Stdout, os.Stderr))
	}
	sb, code := start(os.Args[1:], os.Stdout, os.Stderr)
	if sb == nil {
		os.Exit(code)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	<-ctx.Done()
	sb.Close()
}

// start serves a sandbox as args say, prints its URL on stdout and the
// settings for the apps on stderr. A nil sandbox comes with the exit
// code.
func start(args []string, stdout, stderr io.Writer) (*demo.Sandbox, int) {
	fs := flag.NewFlagSet("sandbox", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:9090", "listen `ADDR` (port 0 picks a free one)")
	lifetime := fs.Duration("access-token-lifetime", 0, "access-token lifetime (default 1h)")
	clientID := fs.String("client-id", defaultClientID, "the registered client's id (its secret: SANDBOX_CLIENT_SECRET, default "+defaultSecret+")")
	authStyle := fs.String("auth-style", "both", "how the token endpoint takes the client's credentials: `header` (HTTP Basic only; "+
		"the form body is answered 401 invalid_client), params (the form body only) or both")
	omitExpiresIn := fs.Bool("omit-expires-in", false, "answer without expires_in, as providers that never say how long a token lives "+
		"(clients learn it from a 401)")
	secretFile := fs.String("client-secret-file", "", "read the client's secret from the first line of `PATH` instead of "+
		"SANDBOX_CLIENT_SECRET; on SIGHUP read it again and rotate to it, refusing the old secret from then on")
	like := fs.String("like", "", "behave as the provider profile `PROFILE` declares (tokenctl provider profiles): its dead-grant answer, "+
		"grace window, refresh expiry, per-tenant token URL and extra token fields; the flags below override it")
	var sw sandbox.Options
	fs.DurationVar(&sw.ReuseGrace, "reuse-grace", 0, "accept a rotated refresh token again within `D`, answering as the first time (0: never)")
	fs.DurationVar(&sw.RefreshTokenLifespan, "refresh-idle", 0, "a refresh token dies unused after `D` (default 30 days)")
	fs.DurationVar(&sw.RefreshAbsolute, "refresh-absolute", 0, "every refresh of a grant is refused `D` after its consent (0: never)")
	fs.StringVar(&sw.Tenant, "tenant", "", "serve the token endpoint only at /t/`ID`/oauth2/token")
	deadGrant := fs.String("dead-grant", "", "answer a dead grant as `STATUS:FIELD:CODE` (e.g. 200:error:bad_refresh_token) instead of 400 invalid_grant")
	extra := fs.String("extra-fields", "", "add `k=v,k=v` to every token answer (e.g. instance_url=https://x)")
	loseEvery := fs.Int("lose-answer-every", 0, "process every `N`th refresh but never answer it (0: never)")
	dex := fs.Bool("dex", false, "answer as Dex does: a dead, revoked or already-claimed refresh token 400 invalid_request "+
		"(not invalid_grant), and a rotated one presented again within 3 s answered again without rotating (--reuse-grace overrides)")
	tokenRate := fs.Int("token-rate", 0, "answer 429 with Retry-After: 1 to token requests beyond `N` a second (0: no limit)")
	unknownCode := fs.Bool("unknown-code", false, "answer every refresh 400 {\"error\":\""+sandbox.UnknownCode+"\"}, a code no table knows (the refresh token stays valid)")
	scopes := fs.String("scopes", "api", "the `SCOPES` the client may ask for, space-separated (\"offline\" and \"offline_access\" too)")
	refreshScope := fs.String("refresh-scope", "", "a refresh grants only those of the grant's scopes listed in `SCOPES` (space-separated; "+
		"\"\" none): fewer scopes than at consent, said in the answer's scope and carried by the rotated tokens (unset: all of them)")
	omitRefreshScope := fs.Bool("omit-refresh-scope", false, "answer refreshes without scope, as RFC 6749 §5.1 allows when it is unchanged")
	fs.DurationVar(&sw.RefreshLatency, "token-latency", 0, "answer every refresh `D` late, as a slow provider (the refresh is done meanwhile, "+
		"and stands even if the client gives up first)")
	hangFor := fs.Duration("hang-for", 0, "for `D` from start, accept every refresh and never answer it, as a hung provider (held until the "+
		"client gives up, at most a minute; the refresh token is not spent); then answer as usual")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: sandbox [flags]        serve a strict OAuth2 provider (rotating refresh tokens, reuse revokes the grant)
       sandbox grant [flags]  print a first token from a running sandbox (sandbox grant -h)

Flags:
`)
		fs.PrintDefaults()
		fmt.Fprintf(fs.Output(), "\nEnvironment:\n  SANDBOX_CLIENT_SECRET  the registered client's secret (default %s)\n", defaultSecret)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, 0
		}
		return nil, 2
	}
	if *hangFor < 0 || sw.RefreshLatency < 0 {
		fmt.Fprintln(stderr, "sandbox: --hang-for and --token-latency must not be negative")
		return nil, 2
	}
	opts, err := switches(*like, sw, *deadGrant, *extra, *loseEvery, fs)
	if err != nil {
		fmt.Fprintln(stderr, "sandbox:", err)
		return nil, 2
	}
	if *dex {
		opts = sandbox.Dex(opts)
	}
	opts.TokenRate = *tokenRate
	opts.Scopes, opts.OmitRefreshScope = strings.Fields(*scopes), *omitRefreshScope
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "refresh-scope" {
			opts.RefreshScopes = append([]string{}, strings.Fields(*refreshScope)...)
		}
	})
	if *unknownCode {
		opts.RefreshFault = func() sandbox.Fault { return sandbox.FaultUnknownCode }
	}
	if *hangFor > 0 {
		until, then := time.Now().Add(*hangFor), opts.RefreshFault
		opts.RefreshFault = func() sandbox.Fault {
			switch {
			case time.Now().Before(until):
				return sandbox.FaultHang
			case then != nil:
				return then()
			}
			return sandbox.FaultNone
		}
	}
	clientAuth, ok := map[string]string{"header": sandbox.ClientAuthBasic, "params": sandbox.ClientAuthPost, "both": ""}[*authStyle]
	if !ok {
		fmt.Fprintf(stderr, "sandbox: --auth-style %q: want header, params or both\n", *authStyle)
		return nil, 2
	}
	secret := clientSecret()
	if *secretFile != "" {
		var err error
		if secret, err = readSecret(*secretFile); err != nil {
			fmt.Fprintln(stderr, "sandbox:", err)
			return nil, 2
		}
	}
	opts.AccessTokenLifespan, opts.ClientID, opts.ClientSecret = *lifetime, *clientID, secret
	opts.ClientAuth, opts.OmitExpiresIn = clientAuth, *omitExpiresIn
	sb, err := demo.StartSandbox(*addr, opts)
	if err != nil {
		fmt.Fprintln(stderr, "sandbox:", err)
		return nil, 1
	}
	// The settings the quirks call for, on the OAUTH_* line and on the
	// tokenctl provider add line.
	var quirkEnv, quirkFlags string
	if clientAuth != "" {
		quirkEnv += " OAUTH_AUTH_STYLE=" + *authStyle
		quirkFlags += " --auth-style " + *authStyle
	}
	if *omitExpiresIn {
		life := *lifetime
		if life <= 0 {
			life = time.Hour // the sandbox's default
		}
		quirkEnv += " TOKEN_DEFAULT_LIFETIME=" + life.String()
		quirkFlags += " --default-lifetime " + life.String()
	}
	if *secretFile != "" {
		rotateOnHangup(sb, *secretFile, stderr)
	}
	fmt.Fprintln(stdout, sb.URL)
	fmt.Fprintf(stderr, `sandbox: serving at %[1]s. Settings for the apps:
  export OAUTH_TOKEN_URL=%[9]s OAUTH_AUTH_URL=%[1]s/oauth2/auth API_BASE_URL=%[1]s
  export OAUTH_CLIENT_ID=%[2]s OAUTH_CLIENT_SECRET=%[3]s OAUTH_REDIRECT_URL=%[4]s OAUTH_SCOPES=%[10]s%[5]s
For connect sessions at bin/server (the account that consents is read at /userinfo):
  export PUBLIC_URL=%[8]s CONNECT_RETURN_URLS=https://app.example.com/ OAUTH_USERINFO_URL=%[1]s/userinfo
Its API: GET %[1]s/resource with "Authorization: Bearer <access token>"; GET %[1]s/stats counts refreshes and refresh-token reuse.
A first token for connection "acme":
  bin/sandbox grant --url %[1]s%[7]s | bin/tokenctl import --connection acme
Or, beside the OAUTH_* provider, as a stored provider (its connections name it):
  printf '%%s\n' '%[3]s' | bin/tokenctl provider add --name sandbox --token-url %[9]s --auth-url %[1]s/oauth2/auth --client-id %[2]s --api-base-url %[1]s%[6]s
  bin/sandbox grant --url %[1]s%[7]s | bin/tokenctl import --connection globex --provider sandbox
`, sb.URL, *clientID, secret, redirectURL, quirkEnv, quirkFlags, grantFlags(*clientID, opts.Tenant, *scopes), origin(redirectURL), sb.TokenURL(sb.URL), shellWord(*scopes))
	return sb, 0
}

// origin is u's scheme and host: where the server a redirect URL points
// at is reached.
func origin(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return u
	}
	return p.Scheme + "://" + p.Host
}

// switches are the behaviour flags: the profile's (--like), then those
// given on the command line.
func switches(like string, sw sandbox.Options, deadGrant, extra string, loseEvery int, fs *flag.FlagSet) (sandbox.Options, error) {
	var opts sandbox.Options
	if like != "" {
		p, err := profiles.Get(like)
		if err != nil {
			return opts, fmt.Errorf("--like: %w", err)
		}
		opts = sandbox.Like(p, opts)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["reuse-grace"] {
		opts.ReuseGrace = sw.ReuseGrace
	}
	if set["refresh-idle"] {
		opts.RefreshTokenLifespan = sw.RefreshTokenLifespan
	}
	if set["refresh-absolute"] {
		opts.RefreshAbsolute = sw.RefreshAbsolute
	}
	if set["token-latency"] {
		opts.RefreshLatency = sw.RefreshLatency
	}
	if set["tenant"] {
		opts.Tenant = sw.Tenant
	}
	if deadGrant != "" {
		parts := strings.SplitN(deadGrant, ":", 3)
		status, err := strconv.Atoi(parts[0])
		if len(parts) != 3 || err != nil || parts[2] == "" {
			return opts, fmt.Errorf("--dead-grant %q: want STATUS:FIELD:CODE", deadGrant)
		}
		opts.DeadGrant = &sandbox.DeadGrantAnswer{Status: status, Field: parts[1], Code: parts[2]}
	}
	if extra != "" {
		opts.ExtraTokenFields = map[string]string{}
		for kv := range strings.SplitSeq(extra, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return opts, fmt.Errorf("--extra-fields %q: want k=v,k=v", extra)
			}
			opts.ExtraTokenFields[k] = v
		}
	}
	if loseEvery < 0 {
		return opts, errors.New("--lose-answer-every must not be negative")
	}
	if loseEvery > 0 {
		var n atomic.Int64
		opts.RefreshFault = func() sandbox.Fault {
			if n.Add(1)%int64(loseEvery) == 0 {
				return sandbox.FaultLostAnswer
			}
			return sandbox.FaultNone
		}
	}
	return opts, nil
}

// clientSecret is SANDBOX_CLIENT_SECRET, else the default.
func clientSecret() string {
	if s := os.Getenv("SANDBOX_CLIENT_SECRET"); s != "" {
		return s
	}
	return defaultSecret
}

// readSecret is the first line of path.
func readSecret(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("--client-secret-file: %w", err)
	}
	secret, _, _ := strings.Cut(string(b), "\n")
	if secret = strings.TrimSpace(secret); secret == "" {
		return "", fmt.Errorf("--client-secret-file %s: empty", path)
	}
	return secret, nil
}

// rotateOnHangup rotates the client's secret to the one in path on every
// SIGHUP, as an operator does at a real provider: the old one is refused
// at once.
func rotateOnHangup(sb *demo.Sandbox, path string, stderr io.Writer) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		for range hup {
			secret, err := readSecret(path)
			if err != nil {
				fmt.Fprintln(stderr, "sandbox: secret not rotated:", err)
				continue
			}
			sb.RotateClientSecret(secret, false)
			fmt.Fprintln(stderr, "sandbox: client secret rotated; the old one is refused")
		}
	}()
}

// shellWord is s as one word of a shell command line.
func shellWord(s string) string {
	if s != "" && !strings.ContainsAny(s, " \t'\"$\\") {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// grantFlags are the flags sandbox grant needs for a client other than
// the default one.
func grantFlags(clientID, tenant, scopes string) string {
	var out string
	if scopes != "api" {
		out += " --scope " + shellWord(scopes)
	}
	if clientID != defaultClientID {
		out += " --client-id " + clientID
	}
	if tenant != "" {
		out += " --tenant " + tenant
	}
	return out
}

// grant runs the authorization-code flow at a running sandbox and prints
// the token as x/oauth2 JSON (what tokenctl import reads).
func grant(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sandbox grant", flag.ContinueOnError)
	fs.SetOutput(stderr)
	base := fs.String("url", "http://127.0.0.1:9090", "the sandbox's `URL`")
	clientID := fs.String("client-id", defaultClientID, "the registered client's id")
	tenant := fs.String("tenant", "", "the sandbox's --tenant `ID`")
	scope := fs.String("scope", "api", "the `SCOPES` to ask for, space-separated (those granted are printed as scope)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: sandbox grant [flags]: a first token, as x/oauth2 JSON with the granted scope, for tokenctl import\n\nFlags:\n")
		fs.PrintDefaults()
		fmt.Fprintf(fs.Output(), "\nEnvironment:\n  SANDBOX_CLIENT_SECRET  the registered client's secret (default %s)\n", defaultSecret)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	endpoint := sandbox.Endpoint(*base)
	if *tenant != "" {
		endpoint.TokenURL = *base + "/t/" + *tenant + "/oauth2/token"
	}
	// Whichever way the sandbox takes the client's credentials: x/oauth2
	// tries HTTP Basic, then the form body.
	endpoint.AuthStyle = oauth2.AuthStyleAutoDetect
	cfg := &oauth2.Config{ClientID: *clientID, ClientSecret: clientSecret(), Endpoint: endpoint,
		RedirectURL: redirectURL, Scopes: strings.Fields(*scope)}
	tok, err := sandbox.Grant(context.Background(), cfg)
	if err != nil {
		fmt.Fprintln(stderr, "sandbox grant:", err)
		return 1
	}
	// x/oauth2 keeps the answer's scope out of its JSON: tokenctl import
	// reads it to know the scopes granted.
	granted, _ := tok.Extra("scope").(string)
	out := struct {
		*oauth2.Token
		Scope string `json:"scope,omitempty"`
	}{tok, granted}
	if err := json.NewEncoder(stdout).Encode(out); err != nil {
		fmt.Fprintln(stderr, "sandbox grant:", err)
		return 1
	}
	return 0
}
