package domain_test

import (
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/tokenguard/tokenguard/domain"
)

// scanAllows is what a store answers for name from the key's scans: one of
// them has the name's prefix and matches it (pure logic, standing in for
// the SQL the repository derives from the same scans).
func scanAllows(a domain.KeyAccess, name string) bool {
	scans, all := a.ConnectionScans()
	if all {
		return true
	}
	for _, s := range scans {
		switch {
		case s.Exact:
			if name == s.Prefix {
				return true
			}
		case !strings.HasPrefix(name, s.Prefix):
		case s.Regexp == "" || regexp.MustCompile(s.Regexp).MatchString(name):
			return true
		}
	}
	return false
}

// TestConnectionScansAgreeWithAllowsConnection: for every pattern, the
// scans select exactly the names AllowsConnection allows.
func TestConnectionScansAgreeWithAllowsConnection(t *testing.T) {
	names := []string{"tenant-a-1", "tenant-a-zzz", "tenant-a.1", "tenant-a", "tenant-ab", "tenant_a-1", "tenantXa-1",
		"acme", "acme-prod", "a", "A", "b-prod", "x.y", "x_y", "xy", "z9", "tenant-b-2"}
	patterns := [][]string{
		{"tenant-a-*"}, {"tenant_a-*"}, {"tenant?a-*"}, {"acme"}, {"*"}, {"*", "acme"}, {"tenant-a-*", "acme"},
		{"*-prod"}, {"x.y"}, {"x_y"}, {`x\_y`}, {`x\.y`}, {"x%y"}, {`x\y`}, {"tenant-[a-b]-*"}, {"tenant-[^a]-*"},
		{`[\-]*`}, {"[z-a]"}, {"[^z-a]*"}, {"?"}, {"a*b*"}, {"acme*"}, {"tenant-a-\\*"}, {"t*-1", "acme-*"}, {"/etc"}, {}, nil,
	}
	for _, ps := range patterns {
		a := domain.KeyAccess{Connections: ps}
		for _, n := range names {
			if got, want := scanAllows(a, n), a.AllowsConnection(n); got != want {
				scans, all := a.ConnectionScans()
				t.Errorf("patterns %q, name %q: scans (%+v, all %v) allow %v, AllowsConnection %v", ps, n, scans, all, got, want)
			}
		}
	}

	// And on random patterns and names over the characters that matter.
	rng := rand.New(rand.NewPCG(38, 4))
	patAlphabet := []byte(`abz-_.%\*?[]^`)
	nameAlphabet := []byte(`abz-_.`)
	random := func(alphabet []byte, n int) string {
		b := make([]byte, 1+rng.IntN(n))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		return string(b)
	}
	checked := 0
	for checked < 3000 {
		p := random(patAlphabet, 7)
		if domain.ValidateConnectionPattern(p) != nil {
			continue
		}
		checked++
		a := domain.KeyAccess{Connections: []string{p}}
		for range 20 {
			n := "a" + random(nameAlphabet, 6) // a name starts with a letter or digit
			if got, want := scanAllows(a, n), a.AllowsConnection(n); got != want {
				t.Fatalf("pattern %q, name %q: scans allow %v, AllowsConnection %v", p, n, got, want)
			}
		}
	}
}

func TestConnectionScansNarrow(t *testing.T) {
	for p, want := range map[string]domain.ConnectionScan{
		"tenant-a-*":   {Prefix: "tenant-a-"},
		"acme":         {Prefix: "acme", Exact: true},
		`x\_y`:         {Prefix: "x_y", Exact: true},
		"*-prod":       {Regexp: `^[^/]*\-prod$`},
		"tenant-?-*":   {Prefix: "tenant-", Regexp: `^tenant\-[^/]\-[^/]*$`},
		"t[a-b]*":      {Prefix: "t", Regexp: `^t[a-b][^/]*$`},
		"tenant_a-*":   {Prefix: "tenant_a-"},
		`tenant\*-*`:   {Prefix: "tenant*-"},
		"tenant-a-*-x": {Prefix: "tenant-a-", Regexp: `^tenant\-a\-[^/]*\-x$`},
	} {
		scans, all := domain.KeyAccess{Connections: []string{p}}.ConnectionScans()
		if all || !slices.Equal(scans, []domain.ConnectionScan{want}) {
			t.Errorf("%q: %+v (all %v), want %+v", p, scans, all, want)
		}
	}
	if _, all := (domain.KeyAccess{}).ConnectionScans(); !all {
		t.Error("no patterns: not all")
	}
	if scans, all := (domain.KeyAccess{Connections: []string{"a/b", "%", "[z-a"}}).ConnectionScans(); all || len(scans) != 2 {
		t.Errorf("patterns matching no name: %+v, %v; want two scans (the malformed one left out)", scans, all)
	}
	if _, all := (domain.KeyAccess{Connections: []string{"acme", "*"}}).ConnectionScans(); !all {
		t.Error("a lone *: not all")
	}
}
