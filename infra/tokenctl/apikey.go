package tokenctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/tokenguard/tokenguard/domain"
)

const apikeyUsage = `usage:
  tokenctl apikey create --name NAME [--connections PATTERNS] [--scopes SCOPES]
                                       create a key; prints it alone on one line (shown once, stored only as a hash).
                                       --connections: comma-separated globs over connection names (tenant-a-*),
                                       default every connection; --scopes: comma-separated, default every scope:
                                       connections:read, token:read, api:call, connect, admin
  tokenctl apikey list                 show keys: name, created, last used, scopes, connection patterns (never the key)
  tokenctl apikey revoke --name NAME   delete the key; the server refuses it within 2 s`

// KeyStore is the server's API keys as the operator sees them.
type KeyStore interface {
	// Create makes key name with access (nil scopes or connections: every);
	// domain.ErrKeyExists if the name is taken.
	Create(ctx context.Context, name string, access domain.KeyAccess) (domain.Secret, error)
	List(ctx context.Context) ([]domain.APIKey, error)
	// Revoke deletes the key; domain.ErrNotFound if there is none.
	Revoke(ctx context.Context, name string) error
}

func apikey(ctx context.Context, args []string, backend Backend, stdio IO) int {
	fail := failer(stdio.Stderr, "apikey ")
	if code, ok := subcommand(args, apikeyUsage, stdio.Stderr); !ok {
		return code
	}
	cmd, rest := args[0], args[1:]
	fs := flag.NewFlagSet("tokenctl apikey "+cmd, flag.ContinueOnError)
	var name, connections, scopes string
	switch cmd {
	case "create":
		fs.StringVar(&connections, "connections", "", "comma-separated `PATTERNS` of the connections the key may use (default: every)")
		fs.StringVar(&scopes, "scopes", "", "comma-separated `SCOPES` (default: every): connections:read, token:read, api:call, connect, admin")
		fallthrough
	case "revoke":
		fs.StringVar(&name, "name", "", "the key's `NAME` (1-128 of A-Z a-z 0-9 . _ -)")
	case "list":
	default:
		return fail(exitUsage, "unknown command (not shown)\n%s", apikeyUsage)
	}
	if code, ok := parseFlags(fs, rest, stdio.Stderr); !ok {
		return code
	}
	access, err := keyAccess(setFlags(fs), scopes, connections, stdio.Stderr)
	if err != nil {
		return fail(exitUsage, "create: %v", err)
	}
	if code, ok := checkName(cmd, "key", name, fail); !ok {
		return code
	}
	return withOpen(ctx, backend, fail, func(s *Stores) int {
		switch cmd {
		case "create":
			key, err := s.Keys.Create(ctx, name, access)
			switch {
			case errors.Is(err, domain.ErrKeyExists):
				return fail(exitUsage, "create: a key named %q exists; revoke it first or pick another name", name)
			case err != nil:
				return fail(exitFor(err, domain.ErrInvalidKeyAccess), "create: %v", err)
			}
			// The only place a key is ever shown: alone on stdout, for a pipe or a secret store.
			fmt.Fprintln(stdio.Stdout, key.Reveal())
			fmt.Fprintf(stdio.Stderr, "tokenctl: created API key %q (scopes %s; connections %s); it is shown only this once\n",
				name, accessList(access.Scopes), accessList(access.Connections))
		case "list":
			return listKeys(ctx, s.Keys, stdio, fail)
		case "revoke":
			if err := s.Keys.Revoke(ctx, name); err != nil {
				return lookupFailed(fail, "revoke", err, fmt.Sprintf("no API key named %q", name))
			}
			fmt.Fprintf(stdio.Stdout, "revoked API key %s\n", name)
		}
		return exitOK
	})
}

// keyAccess is what --scopes and --connections grant (unset: every), warning of a pattern matching no name.
func keyAccess(set map[string]bool, scopes, connections string, stderr io.Writer) (domain.KeyAccess, error) {
	var access domain.KeyAccess
	if set["scopes"] {
		s, err := domain.ParseScopes(strings.Split(scopes, ","))
		if err != nil {
			return access, fmt.Errorf("--scopes: %w", err)
		}
		access.Scopes = s
	}
	if !set["connections"] {
		return access, nil
	}
	if access.Connections = splitList(connections); len(access.Connections) == 0 {
		return access, errors.New("--connections: no pattern given")
	}
	for _, p := range access.Connections {
		if err := domain.ValidateConnectionPattern(p); err != nil {
			return access, fmt.Errorf("--connections: %w", err)
		}
		if domain.MatchesNoName(p) {
			fmt.Fprintf(stderr, "tokenctl: apikey create: warning: the pattern %s matches no connection (names are 1-128 of A-Z a-z 0-9 . _ -)\n", p)
		}
	}
	return access, nil
}

// listKeys is tokenctl apikey list.
func listKeys(ctx context.Context, store KeyStore, stdio IO, fail failFunc) int {
	keys, err := store.List(ctx)
	if err != nil {
		return fail(exitFailure, "list: %v", err)
	}
	if len(keys) == 0 {
		fmt.Fprintln(stdio.Stdout, "no API keys")
		return exitOK
	}
	tw := tabwriter.NewWriter(stdio.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tCREATED\tLAST USED\tSCOPES\tCONNECTIONS")
	for _, k := range keys {
		used := "never"
		if k.LastUsedAt != nil {
			used = formatTime(*k.LastUsedAt)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", k.Name, formatTime(k.CreatedAt), used, accessList(k.Scopes), accessList(k.Connections))
	}
	_ = tw.Flush()
	return exitOK
}

// accessList is a key's scopes or connection patterns: "all" for nil, every one (also for
// keys made before scopes).
func accessList[S ~string](items []S) string {
	if items == nil {
		return "all"
	}
	out := make([]string, len(items))
	for i, s := range items {
		out[i] = string(s)
	}
	return strings.Join(out, ",")
}
