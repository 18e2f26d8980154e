package tokenctl

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

const providerUsage = `usage:
  tokenctl provider add --name NAME --token-url URL --client-id ID [settings] < SECRET
      register a provider; the client secret is read from stdin (one line), never from the command line
  tokenctl provider update --name NAME [settings] [--client-secret-stdin < SECRET]
      change the given settings only; the client secret only with --client-secret-stdin.
      Running apps use the change from their next refresh, without a restart
  tokenctl provider list                  show providers and how many connections use each (never a secret)
  tokenctl provider remove --name NAME    delete a provider no connection uses
settings:
  --api-base-url URL --auth-url URL --revocation-url URL --auth-style auto|header|params --scopes a,b
  --skew D --default-lifetime D --keep-alive D   (0: the global setting)`

// ProviderBackend is the Backend of a tokenctl that manages providers.
type ProviderBackend interface {
	OpenProviders(ctx context.Context) (ProviderStore, func(), error)
}

// ProviderStore is the stored providers as the operator sees them.
type ProviderStore interface {
	// Add registers p; errors wrap domain.ErrProviderExists or
	// domain.ErrInvalidProvider.
	Add(ctx context.Context, p domain.Provider) (domain.Provider, error)
	// Update changes the provider called name with fn under its row lock.
	Update(ctx context.Context, name string, fn func(*domain.Provider) error) (domain.Provider, error)
	List(ctx context.Context) ([]domain.Provider, error)
	// Connections counts the connections naming each provider.
	Connections(ctx context.Context) (map[string]int, error)
	// Remove deletes a provider; domain.ErrProviderInUse while connections
	// name it, domain.ErrUnknownProvider if there is none.
	Remove(ctx context.Context, name string) error
	// Encrypted reports whether client secrets are sealed at rest
	// (TOKEN_ENCRYPTION_KEYS is set).
	Encrypted() bool
}

// providerFlags are the settings add and update take.
type providerFlags struct {
	name, tokenURL, clientID, apiBaseURL, authURL, revocationURL, authStyle, scopes string
	skew, defaultLifetime, keepAlive                                                time.Duration
	secretStdin                                                                     bool
}

func (f *providerFlags) register(fs *flag.FlagSet, update bool) {
	fs.StringVar(&f.name, "name", "", "the provider's `NAME` (1-128 of A-Z a-z 0-9 . _ -)")
	fs.StringVar(&f.tokenURL, "token-url", "", "the token endpoint `URL`")
	fs.StringVar(&f.clientID, "client-id", "", "the client `ID`")
	fs.StringVar(&f.apiBaseURL, "api-base-url", "", "where the bundled apps send the connections' API calls (`URL`; default API_BASE_URL)")
	fs.StringVar(&f.authURL, "auth-url", "", "the authorization endpoint `URL`")
	fs.StringVar(&f.revocationURL, "revocation-url", "", "the RFC 7009 revocation endpoint `URL`")
	fs.StringVar(&f.authStyle, "auth-style", "auto", "client authentication: `auto`, header or params")
	fs.StringVar(&f.scopes, "scopes", "", "comma-separated `SCOPES`")
	fs.DurationVar(&f.skew, "skew", 0, "refresh this long before expiry (`D`; 0: TOKEN_REFRESH_SKEW)")
	fs.DurationVar(&f.defaultLifetime, "default-lifetime", 0, "lifetime of an access token whose answer has no expires_in (`D`; 0: TOKEN_DEFAULT_LIFETIME)")
	fs.DurationVar(&f.keepAlive, "keep-alive", 0, "refresh connections not refreshed for this long (`D`; 0: batch --keep-alive)")
	if update {
		fs.BoolVar(&f.secretStdin, "client-secret-stdin", false, "read a new client secret from stdin (one line)")
	}
}

// apply sets on p the settings given on the command line (set names the
// flags given), and the secret when there is one.
func (f *providerFlags) apply(p *domain.Provider, set map[string]bool, secret *domain.Secret) error {
	str := map[string]*string{"token-url": &p.TokenURL, "client-id": &p.ClientID, "api-base-url": &p.APIBaseURL,
		"auth-url": &p.AuthURL, "revocation-url": &p.RevocationURL}
	val := map[string]string{"token-url": f.tokenURL, "client-id": f.clientID, "api-base-url": f.apiBaseURL,
		"auth-url": f.authURL, "revocation-url": f.revocationURL}
	for k, dst := range str {
		if set[k] {
			*dst = val[k]
		}
	}
	if set["auth-style"] {
		style, err := domain.ParseAuthStyle(f.authStyle)
		if err != nil {
			return err
		}
		p.AuthStyle = style
	}
	if set["scopes"] {
		p.Scopes = nil
		for s := range strings.SplitSeq(f.scopes, ",") {
			if s = strings.TrimSpace(s); s != "" {
				p.Scopes = append(p.Scopes, s)
			}
		}
	}
	for k, d := range map[string]struct {
		dst *time.Duration
		v   time.Duration
	}{"skew": {&p.Skew, f.skew}, "default-lifetime": {&p.DefaultLifetime, f.defaultLifetime}, "keep-alive": {&p.KeepAlive, f.keepAlive}} {
		if set[k] {
			*d.dst = d.v
		}
	}
	if secret != nil {
		p.ClientSecret = *secret
	}
	return nil
}

// readSecret reads a client secret: the first line of r, without its line
// end. It is never echoed, not even in an error.
func readSecret(r io.Reader) (domain.Secret, error) {
	line, err := bufio.NewReaderSize(io.LimitReader(r, 64<<10), 4096).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return domain.Secret{}, errors.New("cannot read the client secret from stdin")
	}
	line = strings.TrimRight(line, "\r\n")
	if strings.TrimSpace(line) == "" {
		return domain.Secret{}, errors.New("no client secret on stdin (pipe it in: ... | tokenctl provider ...)")
	}
	return domain.NewSecret(line), nil
}

func providerCmd(ctx context.Context, args []string, backend Backend, stdio IO) int {
	fail := func(code int, format string, a ...any) int {
		fmt.Fprintf(stdio.Stderr, "tokenctl: provider "+format+"\n", a...)
		return code
	}
	pb, ok := backend.(ProviderBackend)
	if len(args) == 0 || !ok {
		fmt.Fprintln(stdio.Stderr, providerUsage)
		return exitUsage
	}
	cmd, rest := args[0], args[1:]
	fs := flag.NewFlagSet("tokenctl provider "+cmd, flag.ContinueOnError)
	fs.SetOutput(stdio.Stderr)
	var f providerFlags
	switch cmd {
	case "add", "update":
		f.register(fs, cmd == "update")
	case "remove":
		fs.StringVar(&f.name, "name", "", "the provider's `NAME`")
	case "list":
	default:
		return fail(exitUsage, "unknown command %q\n%s", cmd, providerUsage)
	}
	if err := fs.Parse(rest); err != nil {
		return exitUsage
	}
	if fs.NArg() > 0 {
		// Not echoed: it may well be a client secret pasted by mistake.
		return fail(exitUsage, "%s: unexpected argument (not shown; the client secret is read from stdin, never from the command line)", cmd)
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if cmd != "list" {
		if f.name == "" {
			return fail(exitUsage, "%s: --name NAME is required", cmd)
		}
		if err := domain.ValidateName(f.name); err != nil {
			return fail(exitUsage, "%s: invalid provider name %q (want 1-128 of A-Z a-z 0-9 . _ -)", cmd, f.name)
		}
	}
	if cmd == "add" && (f.tokenURL == "" || f.clientID == "") {
		return fail(exitUsage, "add: --token-url URL and --client-id ID are required")
	}
	// Read stdin before opening the database: bad input fails fast.
	var secret *domain.Secret
	if cmd == "add" || f.secretStdin {
		s, err := readSecret(stdio.Stdin)
		if err != nil {
			return fail(exitUsage, "%s: %v", cmd, err)
		}
		secret = &s
	}
	if cmd == "add" {
		set["auth-style"] = true // its default, auto
	}
	store, cleanup, err := pb.OpenProviders(ctx)
	if err != nil {
		var ce *ConfigError
		if errors.As(err, &ce) {
			return fail(exitUsage, "%v", ce)
		}
		return fail(exitFailure, "%v", err)
	}
	defer cleanup()
	usage := func(err error) bool {
		return errors.Is(err, domain.ErrInvalidProvider) || errors.Is(err, domain.ErrProviderExists) ||
			errors.Is(err, domain.ErrUnknownProvider) || errors.Is(err, domain.ErrProviderInUse)
	}
	failed := func(err error) int {
		if usage(err) {
			return fail(exitUsage, "%s: %v", cmd, err)
		}
		return fail(exitFailure, "%s: %v", cmd, err)
	}
	switch cmd {
	case "add":
		p := domain.Provider{Name: f.name}
		if err := f.apply(&p, set, secret); err != nil {
			return failed(err)
		}
		if p, err = store.Add(ctx, p); err != nil {
			return failed(err)
		}
		fmt.Fprintf(stdio.Stdout, "added provider %s (version %d)\n", p.Name, p.Version)
		warnPlaintext(store, stdio)
	case "update":
		p, err := store.Update(ctx, f.name, func(p *domain.Provider) error { return f.apply(p, set, secret) })
		if err != nil {
			return failed(err)
		}
		what := "settings"
		if secret != nil {
			what = "settings and client secret"
		}
		fmt.Fprintf(stdio.Stdout, "updated provider %s (version %d): %s; running apps use them from their next refresh\n", p.Name, p.Version, what)
		if secret != nil {
			warnPlaintext(store, stdio)
		}
	case "remove":
		if err := store.Remove(ctx, f.name); err != nil {
			if errors.Is(err, domain.ErrProviderInUse) {
				return fail(exitUsage, "remove: %v; import their grants under another provider first", err)
			}
			return failed(err)
		}
		fmt.Fprintf(stdio.Stdout, "removed provider %s\n", f.name)
	case "list":
		return listProviders(ctx, store, stdio, fail)
	}
	return exitOK
}

func warnPlaintext(store ProviderStore, stdio IO) {
	if !store.Encrypted() {
		fmt.Fprintln(stdio.Stderr, "tokenctl: warning: TOKEN_ENCRYPTION_KEYS is not set: the client secret is stored in plaintext (tokenctl rotate-key seals it once keys are set)")
	}
}

func listProviders(ctx context.Context, store ProviderStore, stdio IO, fail func(int, string, ...any) int) int {
	list, err := store.List(ctx)
	if err != nil {
		return fail(exitFailure, "list: %v", err)
	}
	if len(list) == 0 {
		fmt.Fprintln(stdio.Stdout, "no providers (connections use the OAUTH_* settings)")
		return exitOK
	}
	used, err := store.Connections(ctx)
	if err != nil {
		return fail(exitFailure, "list: %v", err)
	}
	orGlobal := func(d time.Duration) string {
		if d == 0 {
			return "global"
		}
		return d.String()
	}
	orNone := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	tw := tabwriter.NewWriter(stdio.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tTOKEN URL\tCLIENT ID\tSECRET\tAUTH STYLE\tSCOPES\tSKEW\tDEFAULT LIFETIME\tKEEP-ALIVE\tAPI BASE URL\tREVOCATION URL\tCONNECTIONS\tVERSION\tUPDATED")
	for _, p := range list {
		secret := "none"
		if !p.ClientSecret.IsZero() {
			secret = "set" // never the value
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", p.Name, p.TokenURL, p.ClientID, secret, p.AuthStyle,
			orNone(strings.Join(p.Scopes, ",")), orGlobal(p.Skew), orGlobal(p.DefaultLifetime), orGlobal(p.KeepAlive),
			orNone(p.APIBaseURL), orNone(p.RevocationURL), used[p.Name], p.Version, formatTime(p.UpdatedAt))
	}
	_ = tw.Flush()
	return exitOK
}
