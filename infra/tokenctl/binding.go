package tokenctl

import (
	"cmp"
	"fmt"
	"io"
	"strings"

	"github.com/tokenguard/tokenguard/domain"
)

// printDetails prints each connection's details, when it has any: who
// granted it, the scopes it lacks or lost, its DPoP key, metadata and tags.
func printDetails(w io.Writer, conns []domain.Connection) {
	for _, c := range conns {
		if b := c.Binding; b.Account != "" || b.MissingScopes != "" || b.ScopesReduced != "" {
			line := c.Name + ": granted by " + cmp.Or(b.Account, "an unknown account")
			if b.MissingScopes != "" {
				line += "; missing scopes: " + b.MissingScopes
			}
			if b.ScopesReduced != "" {
				line += "; scopes_reduced: " + b.ScopesReduced
			}
			fmt.Fprintln(w, line)
		}
		if c.DPoPJKT != "" {
			fmt.Fprintln(w, c.Name+": bound to dpop key "+c.DPoPJKT+" (RFC 7638 thumbprint; the key is sealed with the grant)")
		}
		if hasMetadata(c.Metadata) {
			line := c.Name + ": metadata " + cmp.Or(string(c.Metadata.Object), "{}")
			if len(c.Metadata.Tags) > 0 {
				line += "; tags " + strings.Join(c.Metadata.Tags, ",")
			}
			fmt.Fprintln(w, line)
		}
	}
}

// hasMetadata: anything beyond {} and no tags.
func hasMetadata(m domain.Metadata) bool {
	return len(m.Tags) > 0 || (len(m.Object) > 0 && string(m.Object) != "{}")
}
