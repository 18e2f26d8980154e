package repository_test

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"gorm.io/gorm"

	"github.com/tokenguard/tokenguard/domain"
)

// TestPatternListingIsOneExactQuery: a listing for a key limited by
// connection patterns is one statement per page, and returns exactly the
// names the key's rule (domain.KeyAccess.AllowsConnection) allows, in byte
// order, paged by after and limit: patterns with _ % \ . - (which SQL's
// LIKE or a regular expression would read as wildcards), exact names, a
// lone *, several patterns, overlapping ones, classes and wildcards
// anywhere.
func TestPatternListingIsOneExactQuery(t *testing.T) {
	r, db, _ := newRepo(t)
	ctx := context.Background()
	names := []string{"tenant-a-1", "tenant-a-2", "tenant-a-zzz", "tenant-a.1", "tenant-a", "tenant-ab", "tenant_a-1",
		"tenantXa-1", "tenant-a-b-prod", "acme", "acme-prod", "b-prod", "x.y", "x_y", "xy", "A", "a", "z9", "tenant-b-2"}
	for _, n := range names {
		put(t, r, grantToken(n, "at", "rt"))
	}
	slices.Sort(names) // byte order
	var queries atomic.Int64
	if err := db.Callback().Query().Before("gorm:query").Register("test:count", func(*gorm.DB) { queries.Add(1) }); err != nil {
		t.Fatal(err)
	}
	for _, ps := range [][]string{
		{"tenant-a-*"}, {"tenant_a-*"}, {"tenant?a-*"}, {"acme"}, {"*"}, {"*", "acme"}, {"tenant-a-*", "acme"},
		{"tenant-a-*", "tenant-*"}, {"*-prod"}, {"x.y"}, {"x_y"}, {`x\_y`}, {`x\.y`}, {"x%y"}, {`x\y`}, {"x%"}, {`\x*`},
		{"tenant-[a-b]-*"}, {"tenant-[^a]-*"}, {"[^z-a]*"}, {"?"}, {"a*b*"}, {"acme*"}, {"t*-1", "acme-*"}, {"tenant-a-*-prod"},
		{"/etc"}, {"[z-a]"}, {}, nil,
	} {
		acc := domain.KeyAccess{Connections: ps}
		var want []string
		for _, n := range names {
			if acc.AllowsConnection(n) {
				want = append(want, n)
			}
		}
		scans, all := acc.ConnectionScans()
		for _, page := range []struct {
			after string
			limit int
		}{{"", 100}, {"", 1}, {"", 2}, {"tenant-a-", 2}, {"tenant-a-zzz", 1}, {"acme", 3}} {
			before := queries.Load()
			got, err := r.FilteredConnectionsPage(ctx, domain.ConnectionFilter{Patterns: ps}, page.after, page.limit)
			if err != nil {
				t.Fatalf("%q: %v", ps, err)
			}
			var exp []string
			for _, n := range want {
				if n > page.after && len(exp) < page.limit {
					exp = append(exp, n)
				}
			}
			if g := namesOf(got); !slices.Equal(g, exp) {
				t.Errorf("patterns %q after %q limit %d: %q, want %q", ps, page.after, page.limit, g, exp)
			}
			wantQueries := int64(1)
			if !all && len(scans) == 0 {
				wantQueries = 0 // nothing can match
			}
			if n := queries.Load() - before; n != wantQueries {
				t.Errorf("patterns %q: %d queries for a page, want %d", ps, n, wantQueries)
			}
		}
		// Walking the pages gives every allowed name once.
		var walked []string
		for after := ""; ; {
			page, err := r.FilteredConnectionsPage(ctx, domain.ConnectionFilter{Patterns: ps}, after, 2)
			if err != nil {
				t.Fatal(err)
			}
			walked = append(walked, namesOf(page)...)
			if len(page) < 2 {
				break
			}
			after = page[len(page)-1].Name
		}
		if !slices.Equal(walked, want) {
			t.Errorf("patterns %q: walked %q, want %q", ps, walked, want)
		}
	}
	// The other filters combine with the patterns.
	got, err := r.FilteredConnectionsPage(ctx, domain.ConnectionFilter{Patterns: []string{"tenant-*", "acme*"}, NamePrefix: "tenant-a"}, "", 100)
	if err != nil {
		t.Fatal(err)
	}
	if g := strings.Join(namesOf(got), " "); g != "tenant-a tenant-a-1 tenant-a-2 tenant-a-b-prod tenant-a-zzz tenant-a.1 tenant-ab" {
		t.Errorf("patterns and a name prefix: %s", g)
	}
}

func namesOf(cs []domain.Connection) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.Name
	}
	return out
}
