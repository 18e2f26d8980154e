package tokenctl

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/clientkey"
	"github.com/tokenguard/tokenguard/infra/provider/profiles"
)

const providerUsage = `usage:
  tokenctl provider add --name NAME --token-url URL --client-id ID [settings] < SECRET
  tokenctl provider add --profile PROFILE --name NAME --client-id ID [--param k=v]... [settings] < SECRET
      register a provider; the client secret is read from stdin (one line), never from the command line.
      A profile gives the URLs (its {placeholders} filled by --param), the auth style, the default
      lifetime, a keep-alive of half the refresh token's idle expiry, and its dead-grant codes; any
      setting given on the command line wins
  tokenctl provider profiles [--name PROFILE]   the provider profiles, with the source of every claim
  tokenctl provider update --name NAME [settings] [--client-secret-stdin < SECRET]
      change the given settings only; the client secret only with --client-secret-stdin.
      Running apps use the change from their next refresh, without a restart
  tokenctl provider list                  show providers and how many connections use each (never a secret)
  tokenctl provider remove --name NAME    delete a provider no connection uses
settings:
  --api-base-url URL --auth-url URL --revocation-url URL --auth-style auto|header|params --scopes a,b
  --skew D --default-lifetime D --keep-alive D   (0: the global setting)
  --dpop   the provider requires DPoP: each connection's grant is bound to a key made at connect time
  --resource URL   the RFC 8707 resource indicator of every authorization and token request
  --auth-style private_key_jwt --client-key-file PATH   authenticate with assertions signed by the PEM
           private key in PATH (EC P-256 or RSA; sealed at rest; no client secret on stdin)
  --par auto|always|never   push the connect flow's authorization request (RFC 9126): auto when the
           provider's metadata or profile requires it
  --token-rate N/PERIOD   at most N token requests in any PERIOD, fleet-wide (e.g. 100/1m; none: no budget)`

// ProviderStore is the stored providers as the operator sees them.
type ProviderStore interface {
	Add(ctx context.Context, p domain.Provider) (domain.Provider, error)
	// Update changes the provider called name with fn under its row lock.
	Update(ctx context.Context, name string, fn func(*domain.Provider) error) (domain.Provider, error)
	List(ctx context.Context) ([]domain.Provider, error)
	// Connections counts the connections naming each provider.
	Connections(ctx context.Context) (map[string]int, error)
	// Remove deletes a provider no connection names.
	Remove(ctx context.Context, name string) error
	Encrypted() bool         // client secrets are sealed at rest
	AllowInsecureURLs() bool // ALLOW_INSECURE_URLS
}

// urlFlags are the flags of the provider's URLs, by CheckURLs' field.
var urlFlags = map[string]string{"token URL": "--token-url", "auth URL": "--auth-url",
	"revocation URL": "--revocation-url", "API base URL": "--api-base-url"}

// errInsecure is a provider URL that CheckURLs refused, said by its flag.
type errInsecure struct {
	flag string
	err  error
}

func (e *errInsecure) Error() string {
	if errors.Is(e.err, domain.ErrInsecureURL) {
		return e.flag + " " + domain.ErrInsecureURL.Error()
	}
	return e.flag + " " + domain.ErrNotHTTPURL.Error()
}

func (e *errInsecure) Unwrap() error { return e.err }

// checkURLs refuses a provider URL secrets would reach in the clear.
func checkURLs(p domain.Provider, allowInsecure bool) error {
	if field, err := p.CheckURLs(allowInsecure); err != nil {
		return &errInsecure{flag: urlFlags[field], err: err}
	}
	return nil
}

// providerFlags are the settings add and update take.
type providerFlags struct {
	name, tokenURL, clientID, apiBaseURL, authURL, revocationURL, authStyle, scopes string
	skew, defaultLifetime, keepAlive                                                time.Duration
	secretStdin                                                                     bool
	profile                                                                         string
	params                                                                          paramFlags
	dpop                                                                            bool
	resource, par, clientKeyFile                                                    string
	clientKey                                                                       domain.Secret // read from clientKeyFile
	tokenRate                                                                       string
}

// paramFlags are repeated --param k=v.
type paramFlags []string

func (p *paramFlags) String() string     { return strings.Join(*p, ",") }
func (p *paramFlags) Set(v string) error { *p = append(*p, v); return nil }

func (f *providerFlags) register(fs *flag.FlagSet, update bool) {
	fs.StringVar(&f.name, "name", "", "the provider's `NAME` (1-128 of A-Z a-z 0-9 . _ -)")
	fs.StringVar(&f.tokenURL, "token-url", "", "the token endpoint `URL`")
	fs.StringVar(&f.clientID, "client-id", "", "the client `ID`")
	fs.StringVar(&f.apiBaseURL, "api-base-url", "", "where the bundled apps send the connections' API calls (`URL`; default API_BASE_URL)")
	fs.StringVar(&f.authURL, "auth-url", "", "the authorization endpoint `URL`")
	fs.StringVar(&f.revocationURL, "revocation-url", "", "the RFC 7009 revocation endpoint `URL`")
	fs.StringVar(&f.authStyle, "auth-style", "auto", "client authentication: `auto`, header, params or private_key_jwt")
	fs.StringVar(&f.resource, "resource", "", "the RFC 8707 resource indicator (`URL`) of every authorization and token request")
	fs.StringVar(&f.par, "par", "auto", "push the connect flow's authorization request (RFC 9126): `auto`, always or never")
	fs.StringVar(&f.clientKeyFile, "client-key-file", "", "the PEM private key (EC P-256 or RSA) of --auth-style private_key_jwt (`PATH`)")
	fs.StringVar(&f.scopes, "scopes", "", "comma-separated `SCOPES`")
	fs.DurationVar(&f.skew, "skew", 0, "refresh this long before expiry (`D`; 0: TOKEN_REFRESH_SKEW)")
	fs.DurationVar(&f.defaultLifetime, "default-lifetime", 0, "lifetime of an access token whose answer has no expires_in (`D`; 0: TOKEN_DEFAULT_LIFETIME)")
	fs.DurationVar(&f.keepAlive, "keep-alive", 0, "refresh connections not refreshed for this long (`D`; 0: batch --keep-alive)")
	fs.BoolVar(&f.dpop, "dpop", false, "the provider requires DPoP (RFC 9449): each connection's grant is bound to a key of its own, made at connect time")
	fs.StringVar(&f.tokenRate, "token-rate", "", "a token budget every process respects together: at most N token requests in any PERIOD (`N/PERIOD`, e.g. 20/1s, 100/1m, 10/10m; none: no budget)")
	if update {
		fs.BoolVar(&f.secretStdin, "client-secret-stdin", false, "read a new client secret from stdin (one line)")
	} else {
		fs.StringVar(&f.profile, "profile", "", "start from the provider profile `PROFILE` (tokenctl provider profiles)")
		fs.Var(&f.params, "param", "fill the profile's URL placeholder: `k=v` (repeatable)")
	}
}

// apply sets on p the settings whose flags are in set, and the secret if any.
func (f *providerFlags) apply(p *domain.Provider, set map[string]bool, secret *domain.Secret) error {
	setIf(set, "token-url", &p.TokenURL, f.tokenURL)
	setIf(set, "client-id", &p.ClientID, f.clientID)
	setIf(set, "api-base-url", &p.APIBaseURL, f.apiBaseURL)
	setIf(set, "auth-url", &p.AuthURL, f.authURL)
	setIf(set, "revocation-url", &p.RevocationURL, f.revocationURL)
	setIf(set, "resource", &p.Resource, f.resource)
	setIf(set, "skew", &p.Skew, f.skew)
	setIf(set, "default-lifetime", &p.DefaultLifetime, f.defaultLifetime)
	setIf(set, "keep-alive", &p.KeepAlive, f.keepAlive)
	setIf(set, "dpop", &p.DPoP, f.dpop)
	if set["auth-style"] {
		style, err := domain.ParseAuthStyle(f.authStyle)
		if err != nil {
			return err
		}
		p.AuthStyle = style
	}
	if set["scopes"] {
		p.Scopes = splitList(f.scopes)
	}
	if set["par"] {
		mode, err := domain.ParsePARMode(f.par)
		if err != nil {
			return err
		}
		p.PAR = mode
	}
	switch {
	case set["client-key-file"]:
		p.ClientKey = f.clientKey
	case set["auth-style"] && p.AuthStyle != domain.AuthStylePrivateKeyJWT:
		p.ClientKey = domain.Secret{} // another style needs no key
	}
	if set["token-rate"] {
		rate, err := domain.TokenRate{}, error(nil)
		if f.tokenRate != "none" {
			rate, err = domain.ParseTokenRate(f.tokenRate)
		}
		if err != nil {
			return fmt.Errorf("%w: --token-rate: %w", domain.ErrInvalidProvider, err)
		}
		p.TokenRate = rate
	}
	if secret != nil {
		p.ClientSecret = *secret
	}
	return nil
}

// setIf sets *dst to v when the flag name was given.
func setIf[T any](set map[string]bool, name string, dst *T, v T) {
	if set[name] {
		*dst = v
	}
}

// fromProfile starts p from the profile f names, its URLs filled with the
// --param values; the flags given are applied after it, and win.
func (f *providerFlags) fromProfile(p *domain.Provider, set map[string]bool) error {
	prof, err := profiles.Get(f.profile)
	if err != nil {
		return err
	}
	params, err := profiles.ParseParams(f.params)
	if err != nil {
		return err
	}
	var given profiles.URLs
	if set["token-url"] {
		given.Token = f.tokenURL
	}
	u, err := prof.Complete(given, params)
	var miss *profiles.MissingParamError
	switch {
	case errors.As(err, &miss):
		return fmt.Errorf("%w: profile %s needs --param %s=… (or --token-url)", domain.ErrInvalidProvider, prof.Name, miss.Params[0])
	case err != nil:
		return err
	case u.Token == "":
		return fmt.Errorf("%w: profile %s has no token URL: give --token-url", domain.ErrInvalidProvider, prof.Name)
	}
	if prof.Name != profiles.Generic {
		p.Profile = prof.Name
	}
	p.TokenURL, p.AuthURL, p.RevocationURL, p.AuthStyle = u.Token, u.Auth, u.Revocation, prof.AuthStyle
	if prof.AccessLifetime.Known {
		p.DefaultLifetime = prof.AccessLifetime.D
	}
	if prof.RefreshIdle.Known && prof.RefreshIdle.D > 0 { // refreshed before it dies unused
		p.KeepAlive = prof.RefreshIdle.D / 2
	}
	return nil
}

// readSecret reads a client secret, the first line of r, never echoed.
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
	fail := failer(stdio.Stderr, "provider ")
	if code, ok := subcommand(args, providerUsage, stdio.Stderr); !ok {
		return code
	}
	cmd, rest := args[0], args[1:]
	fs := flag.NewFlagSet("tokenctl provider "+cmd, flag.ContinueOnError)
	var f providerFlags
	switch cmd {
	case "add", "update":
		f.register(fs, cmd == "update")
	case "remove":
		fs.StringVar(&f.name, "name", "", "the provider's `NAME`")
	case "list":
	case "profiles":
		fs.StringVar(&f.name, "name", "", "show every claim of the profile `PROFILE` with its source")
	default:
		return fail(exitUsage, "unknown command (not shown)\n%s", providerUsage)
	}
	if code, ok := parseFlags(fs, rest, stdio.Stderr); !ok {
		return code
	}
	set := setFlags(fs)
	if cmd == "profiles" {
		return listProfiles(f.name, stdio, fail)
	}
	if code, ok := checkName(cmd, "provider", f.name, fail); !ok {
		return code
	}
	if cmd == "add" && ((f.tokenURL == "" && f.profile == "") || f.clientID == "") {
		return fail(exitUsage, "add: --token-url URL (or --profile PROFILE) and --client-id ID are required")
	}
	if len(f.params) > 0 && f.profile == "" {
		return fail(exitUsage, "add: --param needs --profile")
	}
	// Bad input fails before the database is opened.
	if set["par"] {
		if _, err := domain.ParsePARMode(f.par); err != nil || f.par == "" {
			return fail(exitUsage, "%s: --par: %v", cmd, cmp.Or(err, fmt.Errorf("%w: par must be auto, always or never, got \"\"", domain.ErrInvalidProvider)))
		}
	}
	if set["client-key-file"] {
		k, err := readClientKey(f.clientKeyFile)
		if err != nil {
			return fail(exitUsage, "%s: --client-key-file: %v", cmd, err)
		}
		f.clientKey = k
	}
	keyAuth := f.authStyle == string(domain.AuthStylePrivateKeyJWT)
	if cmd == "add" && keyAuth != set["client-key-file"] {
		return fail(exitUsage, "add: --auth-style private_key_jwt and --client-key-file PATH go together")
	}
	var secret *domain.Secret
	if (cmd == "add" && !keyAuth) || f.secretStdin {
		s, err := readSecret(stdio.Stdin)
		if err != nil {
			return fail(exitUsage, "%s: %v", cmd, err)
		}
		secret = &s
	}
	if cmd == "add" && f.profile == "" {
		set["auth-style"] = true // its default, auto
	}
	return withOpen(ctx, backend.OpenProviders, fail, func(store ProviderStore) int {
		return f.run(ctx, cmd, store, set, secret, stdio, fail)
	})
}

// run carries out provider command cmd, its input checked, on store.
func (f *providerFlags) run(ctx context.Context, cmd string, store ProviderStore, set map[string]bool, secret *domain.Secret, stdio IO, fail failFunc) int {
	failed := func(err error) int {
		return fail(exitFor(err, domain.ErrInvalidProvider, domain.ErrProviderExists, domain.ErrUnknownProfile,
			domain.ErrUnknownProvider, domain.ErrProviderInUse), "%s: %v", cmd, err)
	}
	switch cmd {
	case "add":
		p := domain.Provider{Name: f.name}
		if f.profile != "" {
			if err := f.fromProfile(&p, set); err != nil {
				return failed(err)
			}
		}
		if err := f.apply(&p, set, secret); err != nil {
			return failed(err)
		}
		if err := checkURLs(p, store.AllowInsecureURLs()); err != nil {
			return failed(err)
		}
		p, err := store.Add(ctx, p)
		if err != nil {
			return failed(err)
		}
		fmt.Fprintf(stdio.Stdout, "added provider %s (version %d)\n", p.Name, p.Version)
		warnPlaintext(store, stdio)
	case "update":
		p, err := store.Update(ctx, f.name, func(p *domain.Provider) error {
			if err := f.apply(p, set, secret); err != nil {
				return err
			}
			return checkURLs(*p, store.AllowInsecureURLs())
		})
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

// readClientKey reads and checks a PEM private key for private_key_jwt; errors never quote the file.
func readClientKey(path string) (domain.Secret, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return domain.Secret{}, fmt.Errorf("cannot read the key file: %w", errors.Unwrap(err))
	}
	if _, err := clientkey.ParsePEM(data); err != nil {
		return domain.Secret{}, fmt.Errorf("%w: %w", domain.ErrInvalidProvider, err)
	}
	return domain.NewSecret(string(data)), nil
}

func warnPlaintext(store ProviderStore, stdio IO) {
	if !store.Encrypted() {
		fmt.Fprintln(stdio.Stderr, "tokenctl: warning: TOKEN_ENCRYPTION_KEYS is not set: the client secret is stored in plaintext (tokenctl rotate-key seals it once keys are set)")
	}
}

func listProviders(ctx context.Context, store ProviderStore, stdio IO, fail failFunc) int {
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
	tw := tabwriter.NewWriter(stdio.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tTOKEN URL\tCLIENT ID\tSECRET\tAUTH STYLE\tSCOPES\tSKEW\tDEFAULT LIFETIME\tKEEP-ALIVE\tAPI BASE URL\tREVOCATION URL\tCONNECTIONS\tVERSION\tUPDATED\tPROFILE\tDPOP\tRESOURCE\tPAR\tTOKEN RATE")
	for _, p := range list {
		secret := "none"
		if !p.ClientSecret.IsZero() {
			secret = "set" // never the value
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%t\t%s\t%s\t%s\n", p.Name, p.TokenURL, p.ClientID, secret, p.AuthStyle,
			cmp.Or(strings.Join(p.Scopes, ","), "-"), orGlobal(p.Skew), orGlobal(p.DefaultLifetime), orGlobal(p.KeepAlive),
			cmp.Or(p.APIBaseURL, "-"), cmp.Or(p.RevocationURL, "-"), used[p.Name], p.Version, formatTime(p.UpdatedAt),
			cmp.Or(p.Profile, profiles.Generic), p.DPoP, cmp.Or(p.Resource, "-"), cmp.Or(p.PAR, domain.PARAuto), cmp.Or(p.TokenRate.String(), "-"))
	}
	_ = tw.Flush()
	return exitOK
}

// listProfiles prints the catalog, or one profile's claims and sources.
func listProfiles(name string, stdio IO, fail failFunc) int {
	tw := tabwriter.NewWriter(stdio.Stdout, 0, 0, 2, ' ', 0)
	if name != "" {
		p, err := profiles.Get(name)
		if err != nil {
			return fail(exitUsage, "profiles: %v", err)
		}
		src := func(claim string) string { return cmp.Or(p.Sources[claim], "-") }
		deads := make([]string, 0, len(p.DeadGrants))
		for _, d := range p.DeadGrants {
			deads = append(deads, fmt.Sprintf("%s in %q (HTTP %d)", d.Code, d.Field, d.Status))
		}
		params := make([]string, 0, len(p.Params))
		for _, k := range p.ParamNames() {
			params = append(params, k+"="+cmp.Or(p.Params[k], "(required)"))
		}
		fmt.Fprintf(tw, "%s\t%s\n", p.Name, p.Title)
		for _, row := range [][3]string{
			{"token URL", cmp.Or(p.TokenURL, "-"), src("urls")},
			{"auth URL", cmp.Or(p.AuthURL, "-"), src("urls")},
			{"revocation URL", cmp.Or(p.RevocationURL, "-"), src("urls")},
			{"params", cmp.Or(strings.Join(params, " "), "-"), ""},
			{"auth style", string(p.AuthStyle), src("auth_style")},
			{"authorization params", cmp.Or(formatParams(p.AuthParams), "-"), src("auth_params")},
			{"rotation", string(p.Rotation), src("rotation")},
			{"grace", p.Grace.String(), src("grace")},
			{"access lifetime", p.AccessLifetime.String(), src("access_lifetime")},
			{"refresh idle expiry", p.RefreshIdle.String(), src("refresh_idle")},
			{"refresh absolute expiry", p.RefreshAbsolute.String(), src("refresh_absolute")},
			{"dead grant", cmp.Or(strings.Join(deads, "; "), "RFC 6749 codes"), src("dead_grants")},
			{"extra fields", cmp.Or(strings.Join(append(p.ExtraFields, p.CallbackFields...), ","), "-"), cmp.Or(p.Sources["extra_fields"], p.Sources["callback_fields"])},
		} {
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", row[0], row[1], row[2])
		}
		_ = tw.Flush()
		fmt.Fprintf(stdio.Stdout, "  quirks: %s\n", cmp.Or(p.Quirks, "-"))
		return exitOK
	}
	fmt.Fprintln(tw, "PROFILE\tROTATION\tGRACE\tACCESS\tREFRESH IDLE\tREFRESH ABSOLUTE\tDEAD GRANT\tPARAMS\tSOURCE")
	for _, p := range profiles.All() {
		dead := "-"
		if len(p.DeadGrants) > 0 {
			dead = p.DeadGrants[0].Code
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Name, p.Rotation, p.Grace, p.AccessLifetime, p.RefreshIdle,
			p.RefreshAbsolute, dead, cmp.Or(strings.Join(p.ParamNames(), ","), "-"), cmp.Or(p.Sources["urls"], "-"))
	}
	_ = tw.Flush()
	return exitOK
}

func formatParams(m map[string]string) string {
	out := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, k+"="+m[k])
	}
	return strings.Join(out, "&")
}
