// Package tokenctl is the operator CLI (see usage). It needs DATABASE_URL
// (check the OAUTH_ settings too) and never prints a secret.
package tokenctl

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"golang.org/x/oauth2"

	"github.com/tokenguard/tokenguard/domain"
	"github.com/tokenguard/tokenguard/infra/dpop"
	"github.com/tokenguard/tokenguard/infra/provider"
)

const usage = `usage:
  tokenctl migrate                          apply the database migrations
  tokenctl import --connection NAME [--provider P] [--metadata JSON] [--tags a,b] [--dpop-key-file PATH] < TOKEN
                                            store a token (x/oauth2 JSON on stdin) as an active connection,
                                            refreshed at stored provider P (default: the OAUTH_* settings);
                                            --metadata (a JSON object) and --tags replace the connection's
  tokenctl status [--connection NAME]       show connections: status (active, failing, needs_reauth), expiry, version, last refresh,
                                            refresh token expiry, expiring (within TOKEN_EXPIRING_NOTICE), metadata
  tokenctl disconnect --connection NAME [--revoke]
                                            delete the connection under its lock; --revoke first revokes its refresh
                                            token at its provider's revocation endpoint and keeps it if that fails
  tokenctl rotate-key                       re-encrypt every stored token with the current TOKEN_ENCRYPTION_KEYS key
  tokenctl apikey create|list|revoke         manage the server's API keys (tokenctl apikey for details)
  tokenctl reactivate --connection NAME     set a needs_reauth connection active again, tokens untouched (the next refresh decides)
  tokenctl reactivate --all-with-reason R   the same for every connection marked needs_reauth for reason R (e.g. invalid_client)
  tokenctl check                            ask the token endpoint whether it accepts the client, spending no refresh token
  tokenctl provider add|update|list|remove|profiles  manage the stored providers; the provider profiles (tokenctl provider for details)
Configuration: DATABASE_URL (required), TOKEN_ENCRYPTION_KEYS (required by rotate-key),
OAUTH_TOKEN_URL, OAUTH_CLIENT_ID, OAUTH_CLIENT_SECRET, OAUTH_AUTH_STYLE (required by check),
OAUTH_REVOCATION_URL (required by disconnect --revoke).`

// Exit statuses.
const (
	exitOK      = 0
	exitFailure = 1 // the database failed
	exitUsage   = 2 // bad arguments, configuration or input
)

// Backend is what tokenctl works on (di.Tokenctl).
type Backend interface {
	Migrate(ctx context.Context) error
	// RotateKey re-encrypts every stored token with the current key.
	RotateKey(ctx context.Context) (resealed, current int, err error)
	Check(ctx context.Context) (provider.CheckResult, error)
	// Open opens the database for the commands; call the cleanup.
	Open(ctx context.Context) (*Stores, func(), error)
}

// Stores is what the command groups work on.
type Stores struct {
	Connections    Store
	ExpiringNotice time.Duration // TOKEN_EXPIRING_NOTICE

	Keys KeyStore

	Providers         ProviderStore
	Encrypted         bool // client secrets are sealed at rest
	AllowInsecureURLs bool // ALLOW_INSECURE_URLS
}

// Store is the token store as the operator sees it.
type Store interface {
	Connection(ctx context.Context, connection string) (domain.Connection, error)
	// EachConnection calls fn with every connection in name order.
	EachConnection(ctx context.Context, fn func(domain.Connection) error) error
	// Connect stores a new grant of provider ("" for the OAUTH_* one), bound to the DPoP key
	// (PEM, thumbprint jkt) if any; metadata, when not nil, replaces the connection's.
	Connect(ctx context.Context, connection, provider string, g domain.Grant, metadata *domain.Metadata, key domain.Secret, jkt string) (domain.Token, error)
	// Disconnect deletes the connection under its lock, after revoking it when revoke is true
	// (a failed revocation changes nothing).
	Disconnect(ctx context.Context, connection string, revoke bool) (domain.Token, error)
	// Reactivate sets a needs_reauth connection (for reason, if not empty)
	// active again, tokens untouched; version is 0 if it was left alone.
	Reactivate(ctx context.Context, connection, reason string) (found domain.Token, version int64, err error)
	// NeedingReauth pages through the connections needing reauth for reason.
	NeedingReauth(ctx context.Context, reason, after string, limit int) ([]string, error)
}

// ConfigError is a missing or malformed setting (exit status 2).
type ConfigError struct{ Err error }

func (e *ConfigError) Error() string { return e.Err.Error() }
func (e *ConfigError) Unwrap() error { return e.Err }

// IO is where a run reads and writes.
type IO struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
}

// Main runs tokenctl with args and returns the exit status.
func Main(args []string, backend Backend, stdio IO) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	fail := failer(stdio.Stderr, "")
	if code, ok := subcommand(args, usage, stdio.Stderr); !ok {
		return code
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "apikey":
		return apikey(ctx, rest, backend, stdio)
	case "provider":
		return providerCmd(ctx, rest, backend, stdio)
	case "migrate", "rotate-key", "check":
		return adminCmd(ctx, cmd, rest, backend, stdio, fail)
	case "import":
		return importCmd(ctx, rest, backend, stdio, fail)
	case "status", "disconnect", "reactivate":
		return connectionCmd(ctx, cmd, rest, backend, stdio, fail)
	}
	// Not echoed: it may be a token pasted in the wrong place.
	return fail(exitUsage, "unknown command (not shown)\n%s", usage)
}

// adminCmd is tokenctl migrate, check and rotate-key, which take no flags.
func adminCmd(ctx context.Context, cmd string, args []string, backend Backend, stdio IO, fail failFunc) int {
	if code, ok := parseFlags(flag.NewFlagSet("tokenctl "+cmd, flag.ContinueOnError), args, stdio.Stderr); !ok {
		return code
	}
	code, out, err := exitOK, "migrations applied", error(nil)
	switch cmd {
	case "migrate":
		err = backend.Migrate(ctx)
	case "check":
		var res provider.CheckResult
		res, err = backend.Check(ctx)
		if out = res.String(); !res.OK() {
			code = exitFailure
		}
	case "rotate-key":
		var resealed, current int
		resealed, current, err = backend.RotateKey(ctx)
		out = fmt.Sprintf("re-encrypted %d connection(s); %d already used the current key", resealed, current)
	}
	if err != nil {
		return failed(fail, cmd+": ", err)
	}
	fmt.Fprintln(stdio.Stdout, out)
	return code
}

// importCmd is tokenctl import: bad input fails before the database is opened.
func importCmd(ctx context.Context, args []string, backend Backend, stdio IO, fail failFunc) int {
	fs := flag.NewFlagSet("tokenctl import", flag.ContinueOnError)
	var connection, providerName, metadataJSON, tags, dpopKeyFile string
	fs.StringVar(&connection, "connection", "", "connection `NAME` to store the token under")
	fs.StringVar(&providerName, "provider", "", "the stored provider `P` that issued the token (default: the OAUTH_* settings)")
	fs.StringVar(&metadataJSON, "metadata", "", "the connection's metadata, a `JSON` object (replaces what it had)")
	fs.StringVar(&tags, "tags", "", "the connection's tags, comma-separated (`a,b`; replace what it had)")
	fs.StringVar(&dpopKeyFile, "dpop-key-file", "", "the grant is bound to this DPoP key: a PEM EC P-256 private key at `PATH`, sealed and stored with it")
	if code, ok := parseFlags(fs, args, stdio.Stderr); !ok {
		return code
	}
	if connection == "" {
		return fail(exitUsage, "import: --connection NAME is required")
	}
	var metadata *domain.Metadata
	if set := setFlags(fs); set["metadata"] || set["tags"] {
		var tagList []string
		if tags != "" {
			tagList = strings.Split(tags, ",")
		}
		m, err := domain.NewMetadata([]byte(metadataJSON), tagList)
		if err != nil {
			return fail(exitUsage, "import: %v; nothing stored", err)
		}
		metadata = &m
	}
	if err := domain.ValidateName(connection); err != nil {
		return fail(exitUsage, "%v", err)
	}
	if err := domain.ValidateName(providerName); providerName != "" && err != nil {
		return fail(exitUsage, "import: invalid provider name %q", providerName)
	}
	grant, err := readGrant(stdio.Stdin, time.Now())
	if err != nil {
		return fail(exitUsage, "import: %v", err)
	}
	key, jkt, err := readDPoPKey(dpopKeyFile)
	if err != nil {
		return fail(exitUsage, "import: %v; nothing stored", err)
	}
	return withOpen(ctx, backend, fail, func(s *Stores) int {
		t, err := s.Connections.Connect(ctx, connection, providerName, grant, metadata, key, jkt)
		if err != nil {
			return fail(exitFor(err, domain.ErrInvalidToken, domain.ErrInvalidConnection, domain.ErrUnknownProvider,
				domain.ErrInvalidMetadata), "import: %v", err)
		}
		note := ""
		if t.Provider != "" {
			note = ", provider " + t.Provider
		}
		fmt.Fprintf(stdio.Stdout, "imported connection %s: status %s, expiry %s, version %d%s\n",
			t.Connection, t.Status, formatTime(t.Expiry), t.Version, note)
		return exitOK
	})
}

// connectionCmd is tokenctl status, disconnect and reactivate.
func connectionCmd(ctx context.Context, cmd string, args []string, backend Backend, stdio IO, fail failFunc) int {
	fs := flag.NewFlagSet("tokenctl "+cmd, flag.ContinueOnError)
	var connection, reason string
	var revoke bool
	switch cmd {
	case "disconnect":
		fs.StringVar(&connection, "connection", "", "disconnect connection `NAME`")
		fs.BoolVar(&revoke, "revoke", false, "revoke the refresh token at the provider first; keep the connection if that fails")
	case "status":
		fs.StringVar(&connection, "connection", "", "show only connection `NAME`")
	case "reactivate":
		fs.StringVar(&connection, "connection", "", "reactivate connection `NAME`")
		fs.StringVar(&reason, "all-with-reason", "", "reactivate every connection marked needs_reauth for `REASON` (e.g. invalid_client)")
	}
	if code, ok := parseFlags(fs, args, stdio.Stderr); !ok {
		return code
	}
	switch {
	case cmd == "disconnect" && connection == "":
		return fail(exitUsage, "disconnect: --connection NAME is required")
	case cmd == "reactivate" && (connection == "") == (reason == ""):
		return fail(exitUsage, "reactivate: give either --connection NAME or --all-with-reason REASON")
	}
	if err := domain.ValidateName(connection); connection != "" && err != nil {
		return fail(exitUsage, "%v", err)
	}
	return withOpen(ctx, backend, fail, func(s *Stores) int {
		switch {
		case cmd == "status":
			return status(ctx, s, connection, stdio, fail)
		case cmd == "disconnect":
			return disconnect(ctx, s.Connections, connection, revoke, stdio, fail)
		case reason != "":
			return reactivateAll(ctx, s.Connections, reason, stdio, fail)
		}
		found, version, err := s.Connections.Reactivate(ctx, connection, "")
		if err != nil {
			return lookupFailed(fail, "reactivate", err, fmt.Sprintf("connection %q not found", connection))
		}
		fmt.Fprintln(stdio.Stdout, reactivated(found, version))
		return exitOK
	})
}

// status is tokenctl status [--connection NAME].
func status(ctx context.Context, s *Stores, connection string, stdio IO, fail failFunc) int {
	now := time.Now()
	p := &statusPrinter{w: stdio.Stdout, notice: s.ExpiringNotice}
	var err error
	if connection == "" {
		err = s.Connections.EachConnection(ctx, func(c domain.Connection) error { p.print(c, now); return nil })
	} else if t, lerr := s.Connections.Connection(ctx, connection); lerr != nil {
		return lookupFailed(fail, "status", lerr, fmt.Sprintf("connection %q not found", connection))
	} else {
		p.print(t, now)
	}
	p.flush()
	if err != nil {
		return fail(exitFailure, "status: %v", err)
	}
	return exitOK
}

// readGrant reads one token in golang.org/x/oauth2's JSON shape, with its granted scope if any.
func readGrant(r io.Reader, now time.Time) (domain.Grant, error) {
	dec := json.NewDecoder(io.LimitReader(r, 1<<20))
	var raw json.RawMessage
	var tok oauth2.Token
	var scope struct {
		Scope *string `json:"scope"`
	}
	err := dec.Decode(&raw)
	if err == nil {
		err = cmp.Or(json.Unmarshal(raw, &tok), json.Unmarshal(raw, &scope))
	}
	if err != nil {
		if errors.Is(err, io.EOF) {
			return domain.Grant{}, errors.New("no token on stdin (want JSON with access_token, token_type, refresh_token, expiry)")
		}
		return domain.Grant{}, fmt.Errorf("stdin is not a token in golang.org/x/oauth2's JSON shape: %w", jsonCause(err))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return domain.Grant{}, errors.New("stdin has more than one JSON value")
	}
	if tok.Expiry.IsZero() && tok.ExpiresIn > 0 {
		tok.Expiry = now.Add(time.Duration(tok.ExpiresIn) * time.Second)
	}
	if tok.RefreshToken == "" {
		return domain.Grant{}, fmt.Errorf("%w: refresh_token is empty; without it the connection could never be refreshed", domain.ErrInvalidToken)
	}
	if tok.AccessToken == "" {
		return domain.Grant{}, fmt.Errorf("%w: access_token is empty", domain.ErrInvalidToken)
	}
	g := provider.GrantFrom(&tok)
	if scope.Scope != nil {
		g.Scope, g.ScopeNamed = *scope.Scope, true
	}
	return g, nil
}

// jsonCause keeps a decoding error free of input (a time's error quotes the value, maybe a pasted token).
func jsonCause(err error) error {
	if syn, ok := errors.AsType[*json.SyntaxError](err); ok {
		return fmt.Errorf("invalid JSON at byte %d", syn.Offset)
	}
	if typ, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
		return fmt.Errorf("field %q must be a %s", typ.Field, typ.Type)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return errors.New("truncated JSON")
	}
	return errors.New("a value does not fit its field (expiry must be RFC 3339)")
}

// readDPoPKey reads the PEM private key at path ("" for none) and its thumbprint; errors never quote the file.
func readDPoPKey(path string) (pem domain.Secret, jkt string, err error) {
	if path == "" {
		return domain.Secret{}, "", nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return domain.Secret{}, "", fmt.Errorf("--dpop-key-file: %w", errors.Unwrap(err))
	}
	k, err := dpop.ParsePEM(data)
	if err != nil {
		return domain.Secret{}, "", fmt.Errorf("--dpop-key-file: %w", err)
	}
	return domain.NewSecret(string(k.MarshalPEM())), k.Thumbprint(), nil
}

// statusPrinter streams status lines aligned in blocks, each followed by its connections' details.
type statusPrinter struct {
	w      io.Writer
	tw     *tabwriter.Writer   // on w, from the first line
	notice time.Duration       // TOKEN_EXPIRING_NOTICE
	block  []domain.Connection // the block's
}

const statusBlock = 500

// expiring is the EXPIRING column: how soon the refresh token dies, once within the notice.
func expiring(t domain.Connection, now time.Time, notice time.Duration) string {
	switch d := t.RefreshExpiry.Sub(now); {
	case t.RefreshExpiry.IsZero() || notice <= 0 || d > notice:
		return "-"
	case d > 0:
		return "in " + d.Round(time.Hour).String()
	}
	return "expired"
}

func (p *statusPrinter) print(t domain.Connection, now time.Time) {
	if p.tw == nil {
		p.tw = tabwriter.NewWriter(p.w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(p.tw, "CONNECTION\tSTATUS\tEXPIRY\tVERSION\tLAST REFRESH\tREFRESH TOKEN EXPIRY\tPROVIDER\tEXPIRING\tREASON")
	}
	exp := formatTime(t.Expiry)
	if !t.Expiry.IsZero() {
		if d := t.Expiry.Sub(now).Round(time.Second); d >= 0 {
			exp += " (in " + d.String() + ")"
		} else {
			exp += " (expired)"
		}
	}
	refreshExp := "unknown" // the provider did not say
	if !t.RefreshExpiry.IsZero() {
		refreshExp = formatTime(t.RefreshExpiry)
	}
	// New columns go before REASON (free text, last): scripts read by position.
	fmt.Fprintf(p.tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", t.Name, t.Status, exp, t.Version, formatTime(t.ObtainedAt), refreshExp,
		cmp.Or(t.Provider, "default"), expiring(t, now, p.notice), t.StatusReason)
	p.block = append(p.block, t) // flush shows its details
	if len(p.block) == statusBlock {
		p.flush()
	}
}

// flush ends the block: it aligns the block's lines, then prints each connection's details,
// when it has any: who granted it, the scopes it lacks or lost, its DPoP key, metadata and tags.
func (p *statusPrinter) flush() {
	if p.tw == nil {
		fmt.Fprintln(p.w, "no connections")
		return
	}
	_ = p.tw.Flush()
	for _, c := range p.block {
		if b := c.Binding; b.Account != "" || b.MissingScopes != "" || b.ScopesReduced != "" {
			line := c.Name + ": granted by " + cmp.Or(b.Account, "an unknown account")
			if b.MissingScopes != "" {
				line += "; missing scopes: " + b.MissingScopes
			}
			if b.ScopesReduced != "" {
				line += "; scopes_reduced: " + b.ScopesReduced
			}
			fmt.Fprintln(p.w, line)
		}
		if c.DPoPJKT != "" {
			fmt.Fprintln(p.w, c.Name+": bound to dpop key "+c.DPoPJKT+" (RFC 7638 thumbprint; the key is sealed with the grant)")
		}
		if m := c.Metadata; len(m.Tags) > 0 || (len(m.Object) > 0 && string(m.Object) != "{}") {
			line := c.Name + ": metadata " + cmp.Or(string(m.Object), "{}")
			if len(m.Tags) > 0 {
				line += "; tags " + strings.Join(m.Tags, ",")
			}
			fmt.Fprintln(p.w, line)
		}
	}
	p.block = p.block[:0]
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "none"
	}
	return t.UTC().Format(time.RFC3339)
}
