package tokenctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

const apikeyUsage = `usage:
  tokenctl apikey create --name NAME   create a key; prints it alone on one line (shown once, stored only as a hash)
  tokenctl apikey list                 show keys: name, created, last used (never the key)
  tokenctl apikey revoke --name NAME   delete the key; the server refuses it within 2 s`

// KeyBackend is the Backend of a tokenctl that manages API keys.
type KeyBackend interface {
	OpenKeys(ctx context.Context) (KeyStore, func(), error)
}

// KeyStore is the server's API keys as the operator sees them.
type KeyStore interface {
	// Create makes a new key called name and returns it; ErrKeyExists if
	// the name is taken.
	Create(ctx context.Context, name string) (domain.Secret, error)
	List(ctx context.Context) ([]APIKey, error)
	// Revoke deletes the key; domain.ErrNotFound if there is none.
	Revoke(ctx context.Context, name string) error
}

// APIKey is a key's description: never the key.
type APIKey struct {
	Name       string
	CreatedAt  time.Time
	LastUsedAt *time.Time
}

// ErrKeyExists: an API key by that name exists already.
var ErrKeyExists = errors.New("an API key with that name exists")

func apikey(ctx context.Context, args []string, backend Backend, stdio IO) int {
	fail := func(code int, format string, a ...any) int {
		fmt.Fprintf(stdio.Stderr, "tokenctl: apikey "+format+"\n", a...)
		return code
	}
	kb, ok := backend.(KeyBackend)
	if len(args) == 0 || !ok {
		fmt.Fprintln(stdio.Stderr, apikeyUsage)
		return exitUsage
	}
	cmd, rest := args[0], args[1:]
	fs := flag.NewFlagSet("tokenctl apikey "+cmd, flag.ContinueOnError)
	fs.SetOutput(stdio.Stderr)
	var name string
	switch cmd {
	case "create", "revoke":
		fs.StringVar(&name, "name", "", "the key's `NAME` (1-128 of A-Z a-z 0-9 . _ -)")
	case "list":
	default:
		return fail(exitUsage, "unknown command %q\n%s", cmd, apikeyUsage)
	}
	if err := fs.Parse(rest); err != nil {
		return exitUsage
	}
	if fs.NArg() > 0 {
		return fail(exitUsage, "%s: unexpected argument %q", cmd, fs.Arg(0))
	}
	if cmd != "list" {
		if name == "" {
			return fail(exitUsage, "%s: --name NAME is required", cmd)
		}
		if err := domain.ValidateName(name); err != nil {
			return fail(exitUsage, "%s: invalid key name %q (want 1-128 of A-Z a-z 0-9 . _ -)", cmd, name)
		}
	}
	store, cleanup, err := kb.OpenKeys(ctx)
	if err != nil {
		var ce *ConfigError
		if errors.As(err, &ce) {
			return fail(exitUsage, "%v", ce)
		}
		return fail(exitFailure, "%v", err)
	}
	defer cleanup()
	switch cmd {
	case "create":
		key, err := store.Create(ctx, name)
		switch {
		case errors.Is(err, ErrKeyExists):
			return fail(exitUsage, "create: a key named %q exists; revoke it first or pick another name", name)
		case err != nil:
			return fail(exitFailure, "create: %v", err)
		}
		// The only place a key is ever shown: alone on stdout, for a
		// pipe or a secret store.
		fmt.Fprintln(stdio.Stdout, key.Reveal())
		fmt.Fprintf(stdio.Stderr, "tokenctl: created API key %q; it is shown only this once\n", name)
	case "list":
		keys, err := store.List(ctx)
		if err != nil {
			return fail(exitFailure, "list: %v", err)
		}
		if len(keys) == 0 {
			fmt.Fprintln(stdio.Stdout, "no API keys")
			return exitOK
		}
		tw := tabwriter.NewWriter(stdio.Stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tCREATED\tLAST USED")
		for _, k := range keys {
			used := "never"
			if k.LastUsedAt != nil {
				used = formatTime(*k.LastUsedAt)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", k.Name, formatTime(k.CreatedAt), used)
		}
		_ = tw.Flush()
	case "revoke":
		err := store.Revoke(ctx, name)
		switch {
		case errors.Is(err, domain.ErrNotFound):
			return fail(exitUsage, "revoke: no API key named %q", name)
		case err != nil:
			return fail(exitFailure, "revoke: %v", err)
		}
		fmt.Fprintf(stdio.Stdout, "revoked API key %s\n", name)
	}
	return exitOK
}
