package profiles

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

func TestCatalog(t *testing.T) {
	want := []string{"atlassian", "auth0", "authentik", "dex", "dropbox", "freee", "generic", "github", "google", "hubspot", "hydra", "keycloak",
		"microsoft", "okta", "quickbooks", "salesforce", "slack", "smaregi", "spotify", "xero", "zitadel", "zoho", "zoom"}
	all := All()
	if len(all) != len(want) {
		t.Fatalf("%d profiles, want %d", len(all), len(want))
	}
	for i, p := range all {
		if p.Name != want[i] {
			t.Fatalf("profile %d is %s, want %s", i, p.Name, want[i])
		}
		if p.Name != Generic && p.Sources["urls"] == "" {
			t.Errorf("%s: URLs without a source", p.Name)
		}
	}
	g, err := Get("")
	if err != nil || g.Name != Generic || g.Rotation != RotationUnknown || g.Grace.Known || len(g.DeadGrants) != 0 {
		t.Fatalf("generic profile = %+v, %v: want every fact unknown", g, err)
	}
	x, _ := Get("xero")
	if x.Grace != (Duration{D: 30 * time.Minute, Known: true}) || x.RefreshIdle.D != 60*24*time.Hour || x.RefreshAbsolute.Known {
		t.Fatalf("xero = %+v", x)
	}
	gh, _ := Get("github")
	if len(gh.DeadGrants) != 1 || gh.DeadGrants[0] != (DeadGrant{Code: "bad_refresh_token", Field: "error", Status: 200}) {
		t.Fatalf("github dead grants = %+v", gh.DeadGrants)
	}
	// A stored provider of a newer release's profile gets the generic behaviour, consent prompt included.
	if u, err := Get("nope"); !errors.Is(err, domain.ErrUnknownProfile) || u.Name != Generic || u.AuthParams["prompt"] != "consent" {
		t.Fatalf("Get(nope) = %+v, %v: want Generic and ErrUnknownProfile", u, err)
	}
}

// A claim without a source is refused, as a file would be at start-up.
func TestClaimNeedsSource(t *testing.T) {
	p := Profile{Name: "x", TokenURL: "https://x.example/token", Sources: map[string]string{"urls": "https://x.example/docs"}}
	if err := p.check(); err != nil {
		t.Fatal(err)
	}
	p.Grace = Duration{D: time.Minute, Known: true}
	if err := p.check(); err == nil {
		t.Fatal("a grace window without a source was accepted")
	}
}

func TestComplete(t *testing.T) {
	ok, _ := Get("okta")
	var miss *MissingParamError
	if u, err := ok.Complete(URLs{}, nil); !errors.As(err, &miss) || !slices.Equal(miss.Params, []string{"domain"}) || !errors.Is(err, domain.ErrInvalidProvider) {
		t.Fatalf("okta without domain: %+v, %v: want domain missing", u, err)
	}
	if u, err := ok.Complete(URLs{Token: "https://given.example/token"}, nil); err != nil || u.Token != "https://given.example/token" {
		t.Fatalf("okta with a token URL given: %+v, %v: want the given URL kept", u, err)
	}
	u, err := ok.Complete(URLs{}, map[string]string{"domain": "acme.okta.com"})
	if err != nil || u.Token != "https://acme.okta.com/oauth2/default/v1/token" {
		t.Fatalf("okta completed to %+v, %v", u, err)
	}
	sm, _ := Get("smaregi")
	u, err = sm.Complete(URLs{Auth: "https://auth.example/"}, map[string]string{"contract_id": "sb_abc12", "id_host": "id.smaregi.dev"})
	if err != nil || u.Token != "https://id.smaregi.dev/app/sb_abc12/token" || u.Auth != "https://auth.example/" {
		t.Fatalf("smaregi completed to %+v, %v", u, err)
	}
	for _, bad := range []map[string]string{{"contract_id": "a/../b"}, {"contract_id": "x", "nope": "y"}, {"contract_id": ""}, {"contract_id": "a?b"}} {
		if _, err := sm.Complete(URLs{}, bad); !errors.Is(err, domain.ErrInvalidProvider) {
			t.Errorf("Complete(%v) = %v, want ErrInvalidProvider", bad, err)
		}
	}
}

func TestDurationText(t *testing.T) {
	for in, want := range map[string]string{"unknown": "unknown", "none": "none", "90d": "90d", "30m": "30m", "8h": "8h", "30s": "30s"} {
		d, err := parseDuration(in)
		if err != nil || d.String() != want {
			t.Errorf("%s: %v %v, want %s", in, d, err, want)
		}
	}
	if _, err := parseDuration("-1d"); err == nil {
		t.Error("-1d accepted")
	}
}

// docRow is a profile's row in docs/providers.md.
func docRow(p Profile) string {
	dead := "RFC 6749"
	if len(p.DeadGrants) > 0 {
		d := p.DeadGrants[0]
		dead = fmt.Sprintf("`%s` in `%s`, HTTP %d", d.Code, d.Field, d.Status)
	}
	src := "—"
	if u := p.Sources["urls"]; u != "" {
		src = "[docs](" + u + ")"
	}
	return fmt.Sprintf("| `%s` | %s | %s | %s | %s / %s | %s | %s | %s |", p.Name, p.Rotation, p.Grace, p.AccessLifetime,
		p.RefreshIdle, p.RefreshAbsolute, dead, p.Quirks, src)
}

// docs/providers.md shows every profile as the catalog has it.
func TestDocsTable(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/providers.md")
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	for _, p := range All() {
		if row := docRow(p); !strings.Contains(string(doc), row+"\n") {
			missing = append(missing, row)
		}
	}
	if len(missing) > 0 {
		t.Errorf("docs/providers.md lacks these rows (or has them out of date):\n%s", strings.Join(missing, "\n"))
	}
}
