package tokenctl

import (
	"fmt"
	"io"

	"github.com/tokenguard/tokenguard/domain"
)

// printBindings says who granted each connection whose account is known,
// and which requested scopes the grant lacks.
func printBindings(w io.Writer, toks []domain.Token) {
	for _, t := range toks {
		b := t.Binding
		if b.Account == "" && b.MissingScopes == "" {
			continue
		}
		account := b.Account
		if account == "" {
			account = "an unknown account"
		}
		line := t.Connection + ": granted by " + account
		if b.MissingScopes != "" {
			line += "; missing scopes: " + b.MissingScopes
		}
		fmt.Fprintln(w, line)
	}
}
