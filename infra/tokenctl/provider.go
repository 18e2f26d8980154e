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
settings (each explained by tokenctl provider add -h):
  --api-base-url URL --auth-url URL --revocation-url URL --auth-style auto|header|params|private_key_jwt
  --client-key-file PATH --scopes a,b --skew D --default-lifetime D --keep-alive D --dpop --resource URL
  --par auto|always|never --token-rate N/PERIOD`

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
}

// providerFlags are the flags of add and update that are no field of the provider.
type providerFlags struct {
	name, profile, scopes, clientKeyFile, tokenRate string
	params                                          []string // repeated --param k=v
	secretStdin                                     bool
}

// register puts add's or update's flags on fs, the settings into p, each defaulting to p's
// value: parsing the command line again into a stored provider changes only the ones given.
func (f *providerFlags) register(fs *flag.FlagSet, p *domain.Provider, update bool) {
	fs.StringVar(&f.name, "name", "", "the provider's `NAME` (1-128 of A-Z a-z 0-9 . _ -)")
	fs.StringVar(&p.TokenURL, "token-url", p.TokenURL, "the token endpoint `URL`")
	fs.StringVar(&p.ClientID, "client-id", p.ClientID, "the client `ID`")
	fs.StringVar(&p.APIBaseURL, "api-base-url", p.APIBaseURL, "where the bundled apps send the connections' API calls (`URL`; default API_BASE_URL)")
	fs.StringVar(&p.AuthURL, "auth-url", p.AuthURL, "the authorization endpoint `URL`")
	fs.StringVar(&p.RevocationURL, "revocation-url", p.RevocationURL, "the RFC 7009 revocation endpoint `URL`")
	fs.StringVar((*string)(&p.AuthStyle), "auth-style", string(p.AuthStyle), "client authentication: `auto`, header, params or private_key_jwt")
	fs.StringVar(&p.Resource, "resource", p.Resource, "the RFC 8707 resource indicator (`URL`) of every authorization and token request")
	fs.StringVar((*string)(&p.PAR), "par", string(p.PAR), "push the connect flow's authorization request (RFC 9126): `auto` (when the provider's metadata or profile requires it), always or never")
	fs.StringVar(&f.clientKeyFile, "client-key-file", "", "the PEM private key (EC P-256 or RSA; sealed at rest; no client secret on stdin) of --auth-style private_key_jwt (`PATH`)")
	fs.StringVar(&f.scopes, "scopes", "", "comma-separated `SCOPES`")
	fs.DurationVar(&p.Skew, "skew", p.Skew, "refresh this long before expiry (`D`; 0: TOKEN_REFRESH_SKEW)")
	fs.DurationVar(&p.DefaultLifetime, "default-lifetime", p.DefaultLifetime, "lifetime of an access token whose answer has no expires_in (`D`; 0: TOKEN_DEFAULT_LIFETIME)")
	fs.DurationVar(&p.KeepAlive, "keep-alive", p.KeepAlive, "refresh connections not refreshed for this long (`D`; 0: batch --keep-alive)")
	fs.BoolVar(&p.DPoP, "dpop", p.DPoP, "the provider requires DPoP (RFC 9449): each connection's grant is bound to a key of its own, made at connect time")
	fs.StringVar(&f.tokenRate, "token-rate", "", "a token budget every process respects together: at most N token requests in any PERIOD (`N/PERIOD`, e.g. 20/1s, 100/1m, 10/10m; none: no budget)")
	if update {
		fs.BoolVar(&f.secretStdin, "client-secret-stdin", false, "read a new client secret from stdin (one line)")
	} else {
		fs.StringVar(&f.profile, "profile", "", "start from the provider profile `PROFILE` (tokenctl provider profiles)")
		fs.Func("param", "fill the profile's URL placeholder: `k=v` (repeatable)", func(v string) error {
			f.params = append(f.params, v)
			return nil
		})
	}
}

// apply parses args (checked already) again into p, then sets clientKey and the secret if any.
func apply(p *domain.Provider, args []string, update bool, clientKey, secret *domain.Secret) error {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	var f providerFlags
	f.register(fs, p, update)
	_ = fs.Parse(args)
	set := setFlags(fs)
	var err error
	if set["auth-style"] {
		if p.AuthStyle, err = domain.ParseAuthStyle(string(p.AuthStyle)); err != nil {
			return err
		}
	}
	if set["scopes"] {
		p.Scopes = splitList(f.scopes)
	}
	switch {
	case clientKey != nil:
		p.ClientKey = *clientKey
	case set["auth-style"] && p.AuthStyle != domain.AuthStylePrivateKeyJWT:
		p.ClientKey = domain.Secret{} // another style needs no key
	}
	if set["token-rate"] {
		p.TokenRate = domain.TokenRate{}
		if f.tokenRate != "none" {
			if p.TokenRate, err = domain.ParseTokenRate(f.tokenRate); err != nil {
				return fmt.Errorf("%w: --token-rate: %w", domain.ErrInvalidProvider, err)
			}
		}
	}
	if secret != nil {
		p.ClientSecret = *secret
	}
	return nil
}

// fromProfile starts p from the profile f names, its URLs filled with the
// --param values (tokenURL, when given, wins); the flags given are applied after it.
func (f *providerFlags) fromProfile(p *domain.Provider, tokenURL string) error {
	prof, err := profiles.Get(f.profile)
	if err != nil {
		return err
	}
	params, err := profiles.ParseParams(f.params)
	if err != nil {
		return err
	}
	u, err := prof.Complete(profiles.URLs{Token: tokenURL}, params)
	switch miss, missing := errors.AsType[*profiles.MissingParamError](err); {
	case missing:
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
	given := domain.Provider{AuthStyle: domain.AuthStyleAuto, PAR: domain.PARAuto} // the flags' defaults
	switch cmd {
	case "add", "update":
		f.register(fs, &given, cmd == "update")
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
	if cmd == "add" && ((given.TokenURL == "" && f.profile == "") || given.ClientID == "") {
		return fail(exitUsage, "add: --token-url URL (or --profile PROFILE) and --client-id ID are required")
	}
	if len(f.params) > 0 && f.profile == "" {
		return fail(exitUsage, "add: --param needs --profile")
	}
	// Bad input fails before the database is opened.
	if set["par"] {
		if _, err := domain.ParsePARMode(string(given.PAR)); err != nil || given.PAR == "" {
			return fail(exitUsage, "%s: --par: %v", cmd, cmp.Or(err, fmt.Errorf("%w: par must be auto, always or never, got \"\"", domain.ErrInvalidProvider)))
		}
	}
	var clientKey *domain.Secret
	if set["client-key-file"] {
		k, err := readClientKey(f.clientKeyFile)
		if err != nil {
			return fail(exitUsage, "%s: --client-key-file: %v", cmd, err)
		}
		clientKey = &k
	}
	keyAuth := given.AuthStyle == domain.AuthStylePrivateKeyJWT
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
	failed := func(err error) int {
		return fail(exitFor(err, domain.ErrInvalidProvider, domain.ErrProviderExists, domain.ErrUnknownProfile,
			domain.ErrUnknownProvider, domain.ErrProviderInUse, domain.ErrInsecureURL, domain.ErrNotHTTPURL), "%s: %v", cmd, err)
	}
	return withOpen(ctx, backend, fail, func(s *Stores) int {
		// change applies the command line to p, refusing a URL secrets would reach in the clear.
		change := func(p *domain.Provider) error {
			if err := apply(p, rest, cmd == "update", clientKey, secret); err != nil {
				return err
			}
			field, err := p.CheckURLs(s.AllowInsecureURLs)
			if err == nil {
				return nil
			}
			cause := domain.ErrNotHTTPURL
			if errors.Is(err, domain.ErrInsecureURL) {
				cause = domain.ErrInsecureURL
			}
			// Said by its flag: CheckURLs' "API base URL" is --api-base-url.
			return fmt.Errorf("--%s %w", strings.ReplaceAll(strings.ToLower(field), " ", "-"), cause)
		}
		switch cmd {
		case "add":
			p := domain.Provider{Name: f.name, AuthStyle: domain.AuthStyleAuto}
			if f.profile != "" {
				if err := f.fromProfile(&p, given.TokenURL); err != nil {
					return failed(err)
				}
			}
			if err := change(&p); err != nil {
				return failed(err)
			}
			p, err := s.Providers.Add(ctx, p)
			if err != nil {
				return failed(err)
			}
			fmt.Fprintf(stdio.Stdout, "added provider %s (version %d)\n", p.Name, p.Version)
			warnPlaintext(s, stdio)
		case "update":
			p, err := s.Providers.Update(ctx, f.name, change)
			if err != nil {
				return failed(err)
			}
			what := "settings"
			if secret != nil {
				what = "settings and client secret"
			}
			fmt.Fprintf(stdio.Stdout, "updated provider %s (version %d): %s; running apps use them from their next refresh\n", p.Name, p.Version, what)
			if secret != nil {
				warnPlaintext(s, stdio)
			}
		case "remove":
			if err := s.Providers.Remove(ctx, f.name); err != nil {
				if errors.Is(err, domain.ErrProviderInUse) {
					return fail(exitUsage, "remove: %v; import their grants under another provider first", err)
				}
				return failed(err)
			}
			fmt.Fprintf(stdio.Stdout, "removed provider %s\n", f.name)
		case "list":
			return listProviders(ctx, s.Providers, stdio, fail)
		}
		return exitOK
	})
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

func warnPlaintext(s *Stores, stdio IO) {
	if !s.Encrypted {
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
		auth := make([]string, 0, len(p.AuthParams))
		for _, k := range slices.Sorted(maps.Keys(p.AuthParams)) {
			auth = append(auth, k+"="+p.AuthParams[k])
		}
		fmt.Fprintf(tw, "%s\t%s\n", p.Name, p.Title)
		for _, row := range [][3]string{
			{"token URL", cmp.Or(p.TokenURL, "-"), src("urls")},
			{"auth URL", cmp.Or(p.AuthURL, "-"), src("urls")},
			{"revocation URL", cmp.Or(p.RevocationURL, "-"), src("urls")},
			{"params", cmp.Or(strings.Join(params, " "), "-"), ""},
			{"auth style", string(p.AuthStyle), src("auth_style")},
			{"authorization params", cmp.Or(strings.Join(auth, "&"), "-"), src("auth_params")},
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
